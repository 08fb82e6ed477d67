//! Rules shared by the memory stores' saved states (the parts of the embedded state
//! file): the version check every restore opens with, and the runs a saved set of pids
//! is written as.
//!
//! ```
//! use tranche_codec::state;
//!
//! assert!(state::check_version(1, 1).is_ok());
//! let err = state::check_version(2, 1).unwrap_err();
//! assert_eq!(err.to_string(), "version 2 (this build reads version 1)");
//! assert_eq!(state::runs(&[1, 2, 3, 7]), [(1, 3), (7, 7)]);
//! ```

use crate::Error;

/// Checks the version a saved state was written with (`found`) against the one this
/// build reads (`reads`): any other version is refused with
/// [`Error::StateVersion`], whose message each store puts in its own "corrupt state"
/// error. There is no migration: a state is read by the build that writes its version.
pub fn check_version(found: u32, reads: u32) -> Result<(), Error> {
    if found != reads {
        return Err(Error::StateVersion { found, reads });
    }
    Ok(())
}

/// The runs of consecutive values in `sorted` (ascending, distinct), as `(first, last)`
/// pairs: how a saved state writes a set of pids.
pub fn runs(sorted: &[u64]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &v in sorted {
        match out.last_mut() {
            Some(run) if run.1.checked_add(1) == Some(v) => run.1 = v,
            _ => out.push((v, v)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_consecutive_values() {
        assert_eq!(runs(&[]), vec![]);
        assert_eq!(runs(&[5]), vec![(5, 5)]);
        assert_eq!(
            runs(&[1, 2, 3, 7, 9, 10, u64::MAX - 1, u64::MAX]),
            vec![(1, 3), (7, 7), (9, 10), (u64::MAX - 1, u64::MAX)]
        );
    }

    #[test]
    fn another_version_is_refused_naming_both() {
        assert!(check_version(3, 3).is_ok());
        let err = check_version(2, 1).unwrap_err();
        assert!(matches!(err, Error::StateVersion { found: 2, reads: 1 }));
        assert_eq!(err.to_string(), "version 2 (this build reads version 1)");
    }
}
