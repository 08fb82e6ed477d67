//! Tidy: a value the Lua scripts share with Rust has one home, its Rust definition.
//!
//! `tranche_codec::lua::compose` writes the constants a script reads as `local` lines in
//! front of it. This test reads each such constant's Rust definition, evaluates it, and
//! refuses its value (and the values derived from it) as a number literal in the code of
//! any `*.lua` file of the workspace: a literal written a second time drifts. Comments
//! may name values. `SIZE_CLASSES` (4) and `SDS_OVERHEAD` (10) are composed too, but too
//! small to refuse as literals.

use std::fs;
use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A constant shared with Lua: where Rust defines it, and where its literal is refused.
struct Shared {
    /// The Rust file defining it, from the workspace root.
    file: &'static str,
    /// Its name there (and in Lua).
    name: &'static str,
    /// The folders whose `*.lua` files must not spell it; `[""]`: every one.
    scope: &'static [&'static str],
    /// The values derived from it that are refused as well.
    derived: fn(u64) -> Vec<u64>,
}

fn itself(v: u64) -> Vec<u64> {
    vec![v]
}

const SHARED: &[Shared] = &[
    Shared {
        file: "codec/src/lua.rs",
        name: "BITMAP_BITS",
        scope: &[""],
        // The last offset, and the 512 MB a bitmap grows to at most.
        derived: |v| vec![v, v - 1, v / 8],
    },
    Shared {
        file: "codec/src/lua.rs",
        name: "GROW_FROM",
        // control's scripts have a limit of 65,536 of their own.
        scope: &[
            "codec/lua",
            "active-store/lua",
            "archive-store/lua",
            "stats/lua",
        ],
        derived: itself,
    },
    Shared {
        // 128 is also the base of the varints of the statistics and archive scripts.
        file: "active-store/src/redis_store/mod.rs",
        name: "MAX_RUN",
        scope: &["active-store/lua"],
        derived: itself,
    },
    Shared {
        file: "active-store/src/redis_store/mod.rs",
        name: "MAX_CLAIM",
        scope: &[""],
        derived: itself,
    },
    Shared {
        file: "stats/src/aggregate.rs",
        name: "RANGE_SIZE",
        scope: &[""],
        derived: itself,
    },
];

/// The value of `const NAME: T = VALUE;` in `source`: a number (with `_`), `A << B`,
/// or `A - B` of those.
fn definition(source: &str, name: &str) -> Option<u64> {
    let at = source.find(&format!("const {name}: "))?;
    let rest = &source[at..];
    let value = rest[rest.find('=')? + 1..rest.find(';')?].replace(['_', ' '], "");
    fn term(t: &str) -> Option<u64> {
        match t.split_once("<<") {
            Some((a, b)) => Some(term(a)? << term(b)?),
            None => t.trim_matches(|c| c == '(' || c == ')').parse().ok(),
        }
    }
    match value.split_once('-') {
        Some((a, b)) => Some(term(a)? - term(b)?),
        None => term(&value),
    }
}

/// The code of a Lua line: without its `--` comment (one outside a string).
fn code(line: &str) -> &str {
    let mut quote = None;
    let mut escaped = false;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match quote {
            Some(_) if escaped => escaped = false,
            Some(_) if b == b'\\' => escaped = true,
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'-' && bytes.get(i + 1) == Some(&b'-') => return &line[..i],
            None => {}
        }
    }
    line
}

/// The number literals of a line of Lua code, as values (decimal, exponent or hex).
fn numbers(code: &str) -> Vec<f64> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = bytes[i].is_ascii_digit()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if !starts {
            i += 1;
            continue;
        }
        let from = i;
        while i < bytes.len()
            && (bytes[i].is_ascii_alphanumeric()
                || bytes[i] == b'.'
                || ((bytes[i] == b'+' || bytes[i] == b'-')
                    && matches!(bytes[i - 1], b'e' | b'E')
                    && !code[from..i].starts_with("0x")))
        {
            i += 1;
        }
        let token = &code[from..i];
        let value = match token.strip_prefix("0x").or(token.strip_prefix("0X")) {
            Some(hex) => u64::from_str_radix(hex, 16).ok().map(|v| v as f64),
            None => token.parse().ok(),
        };
        out.extend(value);
    }
    out
}

/// Every `*.lua` file under `dir`.
fn lua_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n != "target" && n != ".git")
            {
                lua_files(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "lua") {
            out.push(path);
        }
    }
}

#[test]
fn lua_takes_shared_values_from_their_rust_definition() {
    let root = workspace_root();
    let mut files = Vec::new();
    lua_files(&root, &mut files);
    assert!(files.len() > 10, "found {} Lua files", files.len());
    let mut offenders = Vec::new();
    for shared in SHARED {
        let source = fs::read_to_string(root.join(shared.file)).unwrap();
        let value = definition(&source, shared.name)
            .unwrap_or_else(|| panic!("{} defines no {}", shared.file, shared.name));
        let refused = (shared.derived)(value);
        // A power of two also as `2 ^ k`.
        let powers: Vec<String> = refused
            .iter()
            .filter(|v| v.is_power_of_two())
            .map(|v| format!("2^{}", v.trailing_zeros()))
            .collect();
        let scoped = |f: &&PathBuf| shared.scope.iter().any(|s| f.starts_with(root.join(s)));
        for file in files.iter().filter(scoped) {
            let text = fs::read_to_string(file).unwrap();
            for (n, line) in text.lines().enumerate() {
                let code = code(line);
                let dense = code.replace(' ', "");
                let literal = numbers(code)
                    .iter()
                    .any(|x| refused.iter().any(|&r| r as f64 == *x));
                if literal || powers.iter().any(|p| dense.contains(p.as_str())) {
                    let path = file.strip_prefix(&root).unwrap().display();
                    offenders.push(format!(
                        "{path}:{}: {} ({})",
                        n + 1,
                        line.trim(),
                        shared.name
                    ));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "literals of values Rust defines (read the constant the prelude composes):\n{}",
        offenders.join("\n")
    );
}

/// The reader itself: literals in code are found in every spelling, those in comments
/// and strings are not, and definitions evaluate.
#[test]
fn the_reader_finds_literals_in_code_only() {
    assert_eq!(numbers(code("if n > 100000 then -- 128")), [100000.0]);
    assert_eq!(numbers(code("x = 1e5 + 0x80 + 2.5")), [1e5, 128.0, 2.5]);
    assert_eq!(
        numbers(code("local s = 'a--b' .. v2 -- 7")),
        Vec::<f64>::new()
    );
    assert_eq!(numbers(code("f(\"\\\"--\", 3)")), [3.0]);
    assert_eq!(
        definition("pub const X: u64 = 1 << 32;", "X"),
        Some(1 << 32)
    );
    assert_eq!(
        definition("const Y: u64 = (1 << 32) - 1;", "Y"),
        Some((1 << 32) - 1)
    );
    assert_eq!(definition("const Z: usize = 100_000;", "Z"), Some(100_000));
}
