//! The statement as the server is given it: named placeholders (`:from`, `:to`,
//! `:pid`, `:attempt`, `:fence`) rewritten to positional ones, and, with a fence
//! column, the UPDATE guarded by it.
//!
//! The text is read by a small lexer that knows what SQL hides from a rewrite: string
//! literals (`'…'`, `E'…'`, `$tag$…$tag$`), quoted identifiers, comments and `::`
//! casts. A name outside those is rewritten only when it is one of the five
//! placeholders; anything else (`:name` is no SQL) is left for the server to refuse.

use std::ops::Range;

/// The placeholders, in their positional order: `:from` is `$1`, … `:fence` is `$5`.
pub(crate) const PLACEHOLDERS: [&str; 5] = ["from", "to", "pid", "attempt", "fence"];

/// The position of `:fence` (`$5`).
pub(crate) const FENCE: usize = 5;

/// One lexical piece of the statement, with its byte range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An unquoted word: a keyword or an identifier.
    Word,
    /// A string, a quoted identifier or a comment: nothing inside is rewritten.
    Opaque,
    /// `:name`, a named placeholder or something the server will refuse.
    Named,
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// `;`.
    End,
    /// Anything else (operators, numbers, `$1`, `::`).
    Other,
}

struct Token {
    kind: Kind,
    span: Range<usize>,
}

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn is_ident(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit() || c == b'$'
}

/// The statement's tokens. Never fails: an unterminated string or comment runs to the
/// end (the server refuses it).
fn lex(sql: &str) -> Vec<Token> {
    let b = sql.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let c = b[i];
        let kind = match c {
            _ if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            b'\'' => {
                // E'…' takes backslash escapes; the E was lexed as a word before.
                let escapes = matches!(out.last(), Some(Token { kind: Kind::Word, span })
                    if span.end == start && sql[span.clone()].eq_ignore_ascii_case("e"));
                i = quoted(b, i, b'\'', escapes);
                Kind::Opaque
            }
            b'"' => {
                i = quoted(b, i, b'"', false);
                Kind::Opaque
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                Kind::Opaque
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i = block_comment(b, i);
                Kind::Opaque
            }
            b'$' => match dollar_tag(b, i) {
                Some(tag) => {
                    let close = &sql[i..i + tag];
                    i = sql[i + tag..]
                        .find(close)
                        .map_or(b.len(), |at| i + tag + at + tag);
                    Kind::Opaque
                }
                None => {
                    i += 1;
                    while i < b.len() && b[i].is_ascii_digit() {
                        i += 1;
                    }
                    Kind::Other
                }
            },
            b':' if b.get(i + 1) == Some(&b':') => {
                i += 2;
                Kind::Other
            }
            b':' if b.get(i + 1).is_some_and(|&c| is_ident_start(c)) => {
                i += 1;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                Kind::Named
            }
            b'(' => {
                i += 1;
                Kind::Open
            }
            b')' => {
                i += 1;
                Kind::Close
            }
            b';' => {
                i += 1;
                Kind::End
            }
            _ if is_ident_start(c) => {
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                Kind::Word
            }
            _ => {
                // One character at a time: multi-byte characters start with >= 0x80
                // and are words, so this never splits one.
                i += 1;
                Kind::Other
            }
        };
        out.push(Token {
            kind,
            span: start..i,
        });
    }
    out
}

/// The end of a literal opened by `quote` at `i`: a doubled quote is one character,
/// and with `escapes` a backslash escapes the next byte.
fn quoted(b: &[u8], mut i: usize, quote: u8, escapes: bool) -> usize {
    i += 1;
    while i < b.len() {
        if escapes && b[i] == b'\\' {
            i += 2;
        } else if b[i] == quote {
            if b.get(i + 1) == Some(&quote) {
                i += 2;
            } else {
                return i + 1;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The end of a `/* … */` comment at `i`; they nest in SQL.
fn block_comment(b: &[u8], mut i: usize) -> usize {
    let mut depth = 0;
    while i < b.len() {
        if b[i..].starts_with(b"/*") {
            depth += 1;
            i += 2;
        } else if b[i..].starts_with(b"*/") {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    b.len()
}

/// The length of a dollar-quote opener (`$$`, `$body$`) at `i`, if there is one.
fn dollar_tag(b: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    if b.get(j).is_some_and(|&c| is_ident_start(c)) {
        while j < b.len() && is_ident(b[j]) && b[j] != b'$' {
            j += 1;
        }
    }
    (b.get(j) == Some(&b'$')).then_some(j + 1 - i)
}

/// The statement with its named placeholders rewritten (`:from` to `$1`, …), and
/// the highest placeholder it uses (0 for none).
pub(crate) fn positional(sql: &str) -> (String, usize) {
    let mut out = String::with_capacity(sql.len());
    let mut highest = 0;
    let mut copied = 0;
    for token in lex(sql) {
        let text = &sql[token.span.clone()];
        match token.kind {
            Kind::Named => {
                let name = &text[1..];
                if let Some(n) = PLACEHOLDERS
                    .iter()
                    .position(|p| p.eq_ignore_ascii_case(name))
                {
                    out.push_str(&sql[copied..token.span.start]);
                    out.push_str(&format!("${}", n + 1));
                    copied = token.span.end;
                    highest = highest.max(n + 1);
                }
            }
            Kind::Other if text.len() > 1 && text.starts_with('$') => {
                // `$` and digits: too many to parse is too many anyway.
                highest = highest.max(text[1..].parse().unwrap_or(usize::MAX));
            }
            _ => {}
        }
    }
    out.push_str(&sql[copied..]);
    (out, highest)
}

/// `sql` (positional already) guarded by `column`: the UPDATE also sets `column` to
/// the chunk's fence (`$5`), and touches only rows whose `column` is NULL or below it.
/// A worker whose lease was taken over (a higher fence wrote these rows) then updates
/// none of them, and a chunk whose commit was lost on the way back, retried under the
/// same fence, is not applied twice.
///
/// Only a top-level UPDATE can be guarded; anything else is an `Err` with the reason.
pub(crate) fn fenced(sql: &str, column: &str) -> Result<String, String> {
    let tokens = lex(sql);
    let mut depth = 0usize;
    // The top-level tokens, outside parentheses and comments, with their index.
    let mut top = Vec::new();
    for (n, t) in tokens.iter().enumerate() {
        match t.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.saturating_sub(1),
            _ if depth == 0 && !(t.kind == Kind::Opaque && is_comment(&sql[t.span.clone()])) => {
                top.push(n)
            }
            _ => {}
        }
    }
    let word = |n: usize, w: &str| {
        tokens[n].kind == Kind::Word && sql[tokens[n].span.clone()].eq_ignore_ascii_case(w)
    };
    let not_update = || "a fence column needs the statement to be an UPDATE".to_string();
    let update = top
        .iter()
        .position(|&n| word(n, "update"))
        .ok_or_else(not_update)?;
    // A WITH clause may come first; nothing else may.
    if update > 0 && !word(top[0], "with") {
        return Err(not_update());
    }
    let set = top[update..]
        .iter()
        .position(|&n| word(n, "set"))
        .map(|p| update + p)
        .ok_or("the UPDATE has no SET")?;
    // The target as the statement names it: its alias (`UPDATE t AS x`, `UPDATE t x`)
    // or else its written name (`s.t`, `"T"`), ONLY and `*` aside.
    let mut target: Vec<usize> = top[update + 1..set].to_vec();
    if target.first().is_some_and(|&n| word(n, "only")) {
        target.remove(0);
    }
    if target
        .last()
        .is_some_and(|&n| &sql[tokens[n].span.clone()] == "*")
    {
        target.pop();
    }
    let reference = match target.as_slice() {
        [] => return Err("the UPDATE names no table".to_string()),
        [.., a, alias] if word(*a, "as") => sql[tokens[*alias].span.clone()].to_string(),
        [name] => sql[tokens[*name].span.clone()].to_string(),
        [.., before, alias]
            if tokens[*alias].kind != Kind::Other && tokens[*before].kind != Kind::Other =>
        {
            sql[tokens[*alias].span.clone()].to_string()
        }
        [first, .., last] => sql[tokens[*first].span.start..tokens[*last].span.end].to_string(),
    };
    // The statement ends at its first top-level `;`: only more `;` may follow.
    let end_at = top.iter().position(|&n| tokens[n].kind == Kind::End);
    if let Some(e) = end_at
        && top[e..].iter().any(|&n| tokens[n].kind != Kind::End)
    {
        return Err("a fence column needs one statement".to_string());
    }
    let end = end_at.map_or(sql.len(), |e| tokens[top[e]].span.start);
    let after_set: Vec<usize> = top[set + 1..end_at.unwrap_or(top.len()).max(set + 1)].to_vec();
    let where_at = after_set.iter().position(|&n| word(n, "where"));
    let returning = after_set
        .iter()
        .find(|&&n| word(n, "returning"))
        .map_or(end, |&n| tokens[n].span.start);
    let column = quote_ident(column);
    let guard = format!("({reference}.{column} IS NULL OR {reference}.{column} < ${FENCE})");
    let set_end = tokens[top[set]].span.end;
    let mut out = String::with_capacity(sql.len() + 2 * guard.len());
    out.push_str(&sql[..set_end]);
    out.push_str(&format!(" {column} = ${FENCE},"));
    match where_at {
        Some(p) => {
            let where_end = tokens[after_set[p]].span.end;
            out.push_str(&sql[set_end..where_end]);
            // The user's condition in parentheses of its own (an OR in it must not
            // escape the guard), closed on a new line (it may end in a -- comment).
            out.push_str(&format!(" {guard} AND ("));
            out.push_str(&sql[where_end..returning]);
            out.push_str("\n) ");
        }
        None => {
            out.push_str(&sql[set_end..returning]);
            out.push_str(&format!("\nWHERE {guard} "));
        }
    }
    out.push_str(&sql[returning..]);
    Ok(out)
}

fn is_comment(text: &str) -> bool {
    text.starts_with("--") || text.starts_with("/*")
}

/// `name` as a quoted identifier: taken as written, case included.
pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_placeholders_become_positional_outside_literals_and_casts() {
        let check = |sql: &str, expect: &str, highest: usize| {
            assert_eq!(positional(sql), (expect.to_string(), highest), "{sql}");
        };
        check(
            "UPDATE t SET v = 1 WHERE id BETWEEN :from AND :to",
            "UPDATE t SET v = 1 WHERE id BETWEEN $1 AND $2",
            2,
        );
        check(
            "SELECT f(:pid, :attempt::int, :FENCE)",
            "SELECT f($3, $4::int, $5)",
            5,
        );
        check(
            "SELECT ':from', E'\\':to', \"a:pid\", $x$ :to $x$, id::text -- :from\n/* :to /* :pid */ */ FROM t WHERE a = :to",
            "SELECT ':from', E'\\':to', \"a:pid\", $x$ :to $x$, id::text -- :from\n/* :to /* :pid */ */ FROM t WHERE a = $2",
            2,
        );
        // Not a placeholder: left for the server to refuse.
        check("SELECT :other, $5", "SELECT :other, $5", 5);
        check(
            "SELECT $12, $99999999999999999999",
            "SELECT $12, $99999999999999999999",
            usize::MAX,
        );
        check(
            "SELECT 'unterminated :from",
            "SELECT 'unterminated :from",
            0,
        );
        check("SELECT 'a''b:to', :to", "SELECT 'a''b:to', $2", 2);
    }

    #[test]
    fn an_update_is_guarded_by_its_fence_column() {
        let check = |sql: &str, expect: &str| {
            assert_eq!(fenced(sql, "fence").as_deref(), Ok(expect), "{sql}");
        };
        check(
            "UPDATE t SET v = 1 WHERE id BETWEEN $1 AND $2 OR false",
            "UPDATE t SET \"fence\" = $5, v = 1 WHERE (t.\"fence\" IS NULL OR t.\"fence\" < $5) AND ( id BETWEEN $1 AND $2 OR false\n) ",
        );
        check(
            "WITH x AS (SELECT 1 WHERE true) UPDATE ONLY s.t AS u SET v = (SELECT 2 WHERE true) FROM x WHERE u.id = $1 -- c\nRETURNING id;",
            "WITH x AS (SELECT 1 WHERE true) UPDATE ONLY s.t AS u SET \"fence\" = $5, v = (SELECT 2 WHERE true) FROM x WHERE (u.\"fence\" IS NULL OR u.\"fence\" < $5) AND ( u.id = $1 -- c\n\n) RETURNING id;",
        );
        check(
            "update s.t set v = 1",
            "update s.t set \"fence\" = $5, v = 1\nWHERE (s.t.\"fence\" IS NULL OR s.t.\"fence\" < $5) ",
        );
        check(
            "UPDATE t x SET v = 1;",
            "UPDATE t x SET \"fence\" = $5, v = 1\nWHERE (x.\"fence\" IS NULL OR x.\"fence\" < $5) ;",
        );
    }

    #[test]
    fn only_one_update_can_be_fenced() {
        let check = |sql: &str, expect: &str| {
            assert_eq!(fenced(sql, "f"), Err(expect.to_string()), "{sql}");
        };
        let not_update = "a fence column needs the statement to be an UPDATE";
        check("SELECT f($1, $2)", not_update);
        check("WITH u AS (UPDATE t SET v = 1) SELECT 1", not_update);
        check(
            "DELETE FROM t WHERE id = $1; UPDATE t SET v = 1",
            not_update,
        );
        check(
            "UPDATE t SET v = 1; DELETE FROM t",
            "a fence column needs one statement",
        );
        check("UPDATE SET v = 1", "the UPDATE names no table");
        check("UPDATE t", "the UPDATE has no SET");
    }
}
