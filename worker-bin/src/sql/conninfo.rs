//! PostgreSQL's connection string as libpq reads it, in either form (`host=… sslmode=…`
//! or `postgresql://…?sslmode=…`), turned into tokio-postgres's [`Config`] and the
//! [`Tls`] to connect with.
//!
//! tokio-postgres knows only part of libpq's TLS words: no `sslrootcert`, and no
//! `verify-ca` or `verify-full` for `sslmode`. [`postgres`] takes both keys out of the
//! string before tokio-postgres reads the rest, and sets the mode on the [`Config`]
//! itself (`require` for any TLS mode, the verifying being [`Tls`]'s). The splitting
//! follows tokio-postgres's own parsers, so that what is left reads as it would have.

use std::path::Path;
use std::str::FromStr;

use tokio_postgres::Config;
use tokio_postgres::config::SslMode;

use super::mysql::url_decoded;
use super::tls::{PgSslMode, Tls};

/// The keys taken out of the connection string.
const TAKEN: [&str; 2] = ["sslmode", "sslrootcert"];

/// `url` as tokio-postgres's [`Config`] and the [`Tls`] its `sslmode` and
/// `sslrootcert` ask for. Errors are one line, and name what is wrong.
pub(super) fn postgres(url: &str) -> Result<(Config, Tls), String> {
    let (rest, taken) = split(url)?;
    let mut config = Config::from_str(&rest)
        .map_err(|e| format!("the database URL: {}", super::one_line(&e)))?;
    // As libpq does, the last of a key's values is the one that counts.
    let last = |key: &str| taken.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v);
    let mode = match last("sslmode") {
        Some(mode) => PgSslMode::parse(mode)?,
        None => PgSslMode::Disable,
    };
    config.ssl_mode(match mode {
        PgSslMode::Disable => SslMode::Disable,
        PgSslMode::VerifyCa | PgSslMode::VerifyFull => SslMode::Require,
    });
    let tls = Tls::postgres(mode, last("sslrootcert").map(Path::new))?;
    Ok((config, tls))
}

/// `url` without its [`TAKEN`] keys, and those keys' values (decoded) in order.
fn split(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    if ["postgres://", "postgresql://"]
        .iter()
        .any(|p| url.starts_with(p))
    {
        split_url(url)
    } else {
        split_keywords(url)
    }
}

/// The URL form: the keys are in the query, `&`-separated and percent-encoded. The
/// query starts at the first `?` after the credentials (which end at the first `@`),
/// as tokio-postgres reads it.
fn split_url(url: &str) -> Result<(String, Vec<(String, String)>), String> {
    let after = url.find('@').map_or(0, |at| at + 1);
    let Some(q) = url[after..].find('?').map(|q| after + q) else {
        return Ok((url.to_string(), Vec::new()));
    };
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    for pair in url[q + 1..].split('&') {
        let key = pair.split_once('=').map(|(key, _)| key);
        match key.map(url_decoded) {
            Some(Ok(key)) if TAKEN.contains(&key.as_str()) => {
                let value = &pair[pair.find('=').unwrap_or(0) + 1..];
                taken.push((key, url_decoded(value)?));
            }
            // What is not ours, tokio-postgres reads (and refuses, if it must).
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        url[..q].to_string()
    } else {
        format!("{}?{}", &url[..q], kept.join("&"))
    };
    Ok((rest, taken))
}

/// The `key=value` form: whitespace-separated, spaces allowed around `=`, a value
/// single-quoted or not, `\` escaping the next character in either.
fn split_keywords(text: &str) -> Result<(String, Vec<(String, String)>), String> {
    let bad = |m: &str| format!("the database URL: {m}");
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    let mut it = text.char_indices().peekable();
    loop {
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let Some(&(start, _)) = it.peek() else { break };
        while it
            .next_if(|&(_, c)| !c.is_whitespace() && c != '=')
            .is_some()
        {}
        let key_end = it.peek().map_or(text.len(), |&(i, _)| i);
        let key = &text[start..key_end];
        if key.is_empty() {
            return Err(bad("a value without a key"));
        }
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        if it.next_if(|&(_, c)| c == '=').is_none() {
            return Err(bad(&format!("`{key}` has no `=`")));
        }
        while it.next_if(|(_, c)| c.is_whitespace()).is_some() {}
        let mut value = String::new();
        if it.next_if(|&(_, c)| c == '\'').is_some() {
            loop {
                match it.next() {
                    Some((_, '\'')) => break,
                    Some((_, '\\')) => value.extend(it.next().map(|(_, c)| c)),
                    Some((_, c)) => value.push(c),
                    None => return Err(bad(&format!("`{key}`'s quoted value is not closed"))),
                }
            }
        } else {
            while let Some((_, c)) = it.next_if(|(_, c)| !c.is_whitespace()) {
                match c {
                    '\\' => value.extend(it.next().map(|(_, c)| c)),
                    c => value.push(c),
                }
            }
            if value.is_empty() {
                return Err(bad(&format!("`{key}` has no value")));
            }
        }
        let end = it.peek().map_or(text.len(), |&(i, _)| i);
        if TAKEN.contains(&key) {
            taken.push((key.to_string(), value));
        } else {
            kept.push(&text[start..end]);
        }
    }
    Ok((kept.join(" "), taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_tls_words_are_taken_out_of_both_forms_and_the_rest_kept() {
        for (url, rest, words) in [
            (
                "host=h sslmode=verify-full port=5433 sslrootcert=/etc/ca.pem",
                "host=h port=5433",
                &[("sslmode", "verify-full"), ("sslrootcert", "/etc/ca.pem")][..],
            ),
            (
                "host = h  options='-c a=1 -c b=\\'x\\'' sslrootcert = '/my ca\\'s.pem' \
                 dbname=d\\ b sslmode=verify-ca",
                "host = h options='-c a=1 -c b=\\'x\\'' dbname=d\\ b",
                &[("sslrootcert", "/my ca's.pem"), ("sslmode", "verify-ca")],
            ),
            (
                "postgres://u:p?w@h:5/db?sslmode=verify-full&connect_timeout=3\
                 &sslrootcert=/my%20ca.pem",
                "postgres://u:p?w@h:5/db?connect_timeout=3",
                &[("sslmode", "verify-full"), ("sslrootcert", "/my ca.pem")],
            ),
            (
                "postgresql://h/db?sslmode=require",
                "postgresql://h/db",
                &[("sslmode", "require")],
            ),
            ("postgresql://h/db", "postgresql://h/db", &[]),
            ("", "", &[]),
        ] {
            let (got, got_taken) = split(url).unwrap();
            assert_eq!(got, rest, "{url}");
            assert_eq!(got_taken, taken(words), "{url}");
            // What is left is what tokio-postgres reads.
            Config::from_str(&got).unwrap();
        }
    }

    #[test]
    fn the_mode_tokio_postgres_is_given_and_the_last_value_counts() {
        let mode = |url: &str| postgres(url).map(|(config, _)| config.get_ssl_mode());
        assert_eq!(mode("host=h").unwrap(), SslMode::Disable);
        assert_eq!(mode("host=h sslmode=prefer").unwrap(), SslMode::Disable);
        assert_eq!(
            mode("host=h sslmode=verify-full sslmode=disable").unwrap(),
            SslMode::Disable
        );
        for tls in ["require", "verify-ca", "verify-full"] {
            // The system's roots may be empty in a container; a missing CA file says
            // so by name, after the mode was taken.
            let url = format!("postgres://h/db?sslmode={tls}");
            match mode(&url) {
                Ok(mode) => assert_eq!(mode, SslMode::Require, "{url}"),
                Err(e) => assert!(e.contains("no trusted root"), "{url}: {e}"),
            }
        }
    }

    #[test]
    fn what_is_wrong_is_one_line_that_names_it() {
        for (url, words) in [
            ("host=h sslmode=allow", "sslmode=allow: expected disable"),
            ("host=h sslmode=VERIFY-FULL", "expected disable, prefer"),
            ("host=h sslrootcert=/ca.pem", "add sslmode=verify-full"),
            (
                "host=h sslmode=prefer sslrootcert=/ca.pem",
                "sslrootcert is given but TLS is not",
            ),
            (
                "host=h sslmode=verify-full sslrootcert=/nonexistent/ca.pem",
                "sslrootcert=/nonexistent/ca.pem: No such file",
            ),
            ("postgres://h/db?sslrootcert=%zz", "a bad % escape"),
            ("host=h sslrootcert='/ca.pem", "quoted value is not closed"),
            ("host=h sslmode", "`sslmode` has no `=`"),
            ("host=h sslmode=", "`sslmode` has no value"),
            ("host=h =x", "a value without a key"),
            ("host=h sslcert=/c.pem", "unknown option `sslcert`"),
        ] {
            let err = postgres(url).err().unwrap_or_else(|| panic!("{url} taken"));
            assert!(err.contains(words) && !err.contains('\n'), "{url}: {err}");
        }
    }

    #[test]
    fn a_file_without_a_certificate_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("tranche-conninfo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = postgres(&format!(
            "host=h sslmode=verify-full sslrootcert={}",
            empty.display()
        ))
        .err()
        .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            err.contains(&format!(
                "sslrootcert={}: no PEM certificate",
                empty.display()
            )),
            "{err}"
        );
    }
}
