//! The Lua the script crates share, and the one way their scripts are put together.
//!
//! The active store, the archive store and the statistics each run Lua scripts made of
//! fragments: `lua/common.lua` (here) first, then the crate's own preludes, then the
//! script. [`compose`] is the only way to join them: it puts `common.lua` first, and
//! writes each [`Fragment`]'s [`Constant`]s as `local NAME = value` lines in front of
//! its source. A value a script shares with Rust (the bit limit of a bitmap, the most
//! pids of a run, the size of a statistics range) is so written once, in Rust, and
//! never as a literal in a `.lua` file (a tidy test in xtask refuses those).
//!
//! `common.lua` holds the rules all three crates' scripts follow: canonical decimal
//! comparison (`id_lt`), commands over long argument lists (`variadic`), the bit limit
//! of a bitmap (`in_bitmap`) and its growth to an allocator size class
//! (`grow_bitmap`), the floor of fencing tokens (`reserve_tokens`), and the type check
//! of a key written before it is read (`expect_type`). Nothing here
//! talks to Redis: the crates load the composed text.

/// Bit offsets a Redis bitmap holds: 0 up to 2^32 - 1, as a string ends at 512 MB.
/// BITFIELD refuses an offset past it; a plan whose completed-index bits would pass it
/// is refused.
pub const BITMAP_BITS: u64 = 1 << 32;

/// A bitmap needing this many bytes or more is grown by the scripts to just under an
/// allocator size class (`grow_bitmap`); a shorter one Redis grows as it always does.
const GROW_FROM: u64 = 65_536;

/// jemalloc's size classes per power of two, for sizes of 64 KB and more.
const SIZE_CLASSES: u64 = 4;

/// The bytes a Redis string of 64 KB or more holds besides its content: its sds header
/// and the closing NUL.
const SDS_OVERHEAD: u64 = 10;

/// A value of Rust's that a Lua fragment reads, written in front of it as a `local`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Constant {
    /// `local NAME = value`: a number, exact in Lua below 2^53.
    Number(&'static str, u64),
    /// `local NAME = 'ccc…'`: the character repeated that many times, a constant of the
    /// compiled script (building it with `string.rep` would cost every call).
    Repeat(&'static str, char, u64),
}

/// A piece of a script: Lua source and the Rust constants it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    /// Written in front of `source`, in this order.
    pub constants: &'static [Constant],
    /// The Lua text, usually an `include_str!` of a file under the crate's `lua/`.
    pub source: &'static str,
}

impl Fragment {
    /// A fragment that reads no constant.
    pub const fn new(source: &'static str) -> Self {
        Self {
            constants: &[],
            source,
        }
    }

    /// A fragment that reads `constants`.
    pub const fn with(constants: &'static [Constant], source: &'static str) -> Self {
        Self { constants, source }
    }
}

/// `common.lua`, with the constants it reads.
const COMMON: Fragment = Fragment::with(
    &[
        Constant::Number("BITMAP_BITS", BITMAP_BITS),
        Constant::Number("GROW_FROM", GROW_FROM),
        Constant::Number("SIZE_CLASSES", SIZE_CLASSES),
        Constant::Number("SDS_OVERHEAD", SDS_OVERHEAD),
    ],
    include_str!("../lua/common.lua"),
);

/// A script's text: `common.lua`, then `fragments` in order (the crate's preludes,
/// then the script itself), each after its constants.
pub fn compose(fragments: &[&Fragment]) -> String {
    let mut out = String::new();
    for f in std::iter::once(&COMMON).chain(fragments.iter().copied()) {
        for c in f.constants {
            let line = match *c {
                Constant::Number(name, v) => format!("local {name} = {v}\n"),
                Constant::Repeat(name, ch, n) => {
                    let text: String = std::iter::repeat_n(ch, n as usize).collect();
                    format!("local {name} = '{text}'\n")
                }
            };
            out.push_str(&line);
        }
        out.push_str(f.source);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_come_before_their_fragment_and_common_comes_first() {
        const RUNS: Fragment = Fragment::with(
            &[
                Constant::Number("MAX_RUN", 3),
                Constant::Repeat("FULL", 'c', 3),
            ],
            "return MAX_RUN",
        );
        let text = compose(&[&Fragment::new("-- prelude"), &RUNS]);
        let common = text.find("local function id_lt").expect("common.lua is in");
        let bits = text
            .find("local BITMAP_BITS = 4294967296\n")
            .expect("its constant");
        let prelude = text.find("-- prelude\n").expect("the prelude");
        let tail = "local MAX_RUN = 3\nlocal FULL = 'ccc'\nreturn MAX_RUN\n";
        assert!(bits < common && common < prelude, "{text}");
        assert!(text.ends_with(tail), "{text}");
    }

    #[test]
    fn the_bit_limit_is_what_a_512_mb_string_holds() {
        assert_eq!(BITMAP_BITS / 8, 512 << 20);
    }
}
