//! The statement as MySQL or MariaDB is given it: placeholders (`:from`, `:to`,
//! `:pid`, `:attempt`, `:fence`, `$1`..`$5`, or `?` in that order) rewritten to `?`
//! with the list of what each binds, and, with a fence column, the UPDATE guarded by
//! it.
//!
//! The text is read by a small lexer that knows what MySQL hides from a rewrite: string
//! literals (`'…'` and `"…"`, with backslash escapes and doubled quotes), `` `quoted` ``
//! identifiers, and comments (`-- `, `#`, `/* … */`). The PostgreSQL lexer
//! (`statement`) cannot serve: it knows neither backslash escapes nor backticks, and
//! quotes identifiers with `"`, a string in MySQL.

use std::ops::Range;

use super::statement::{FENCE, PLACEHOLDERS};

/// One lexical piece of the statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An unquoted word: a keyword or an identifier.
    Word,
    /// A string or a quoted identifier: nothing inside is rewritten.
    Quoted,
    /// A comment.
    Comment,
    /// `:name`.
    Named,
    /// `?`.
    Positional,
    /// `$` and digits.
    Dollar,
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// `;`.
    End,
    /// White space.
    Space,
    /// Anything else.
    Other,
}

struct Token {
    kind: Kind,
    span: Range<usize>,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
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
                while i < b.len() && b[i].is_ascii_whitespace() {
                    i += 1;
                }
                Kind::Space
            }
            b'\'' | b'"' | b'`' => {
                i += 1;
                loop {
                    match b.get(i) {
                        None => break,
                        Some(&q) if q == c => {
                            // A doubled quote stays inside.
                            if b.get(i + 1) == Some(&c) {
                                i += 2;
                            } else {
                                i += 1;
                                break;
                            }
                        }
                        Some(b'\\') if c != b'`' => i += 2,
                        Some(_) => i += 1,
                    }
                }
                i = i.min(b.len());
                Kind::Quoted
            }
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                Kind::Comment
            }
            // `--` starts a comment only when white space (or the end) follows.
            b'-' if b.get(i + 1) == Some(&b'-')
                && b.get(i + 2).is_none_or(|c| c.is_ascii_whitespace()) =>
            {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
                Kind::Comment
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i = (i + 2).min(b.len());
                Kind::Comment
            }
            b':' if b
                .get(i + 1)
                .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_') =>
            {
                i += 1;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                Kind::Named
            }
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                i += 1;
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                if sql[start + 1..i].bytes().all(|c| c.is_ascii_digit()) {
                    Kind::Dollar
                } else {
                    Kind::Word
                }
            }
            _ if is_ident(c) => {
                while i < b.len() && is_ident(b[i]) {
                    i += 1;
                }
                Kind::Word
            }
            b'?' => {
                i += 1;
                Kind::Positional
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
            _ => {
                // One character, whole (a multi-byte one is an ident byte anyway).
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

/// The statement with every placeholder written by name (`?` number n and `$n` as the
/// n-th of `:from :to :pid :attempt :fence`). Mixing `?` with names is refused, and so
/// is a sixth `?` or a `$6`: a chunk binds five values.
fn named(sql: &str) -> Result<String, String> {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut copied = 0;
    let (mut questions, mut names) = (0usize, false);
    for token in lex(sql) {
        let text = &sql[token.span.clone()];
        let n = match token.kind {
            Kind::Positional => {
                questions += 1;
                questions
            }
            Kind::Dollar => {
                names = true;
                text[1..].parse().unwrap_or(usize::MAX)
            }
            Kind::Named => {
                names = true;
                continue;
            }
            _ => continue,
        };
        if n == 0 || n > FENCE {
            return Err(format!(
                "the statement uses a placeholder beyond the fifth ({text}); a chunk binds \
                 five: :from, :to, :pid, :attempt, :fence (or ? in that order)"
            ));
        }
        out.push_str(&sql[copied..token.span.start]);
        out.push(':');
        out.push_str(PLACEHOLDERS[n - 1]);
        copied = token.span.end;
    }
    if questions > 0 && names {
        return Err("the statement mixes ? with named placeholders: use one or the other".into());
    }
    out.push_str(&sql[copied..]);
    Ok(out)
}

/// The statement for the server: `sql`'s placeholders as `?`, and what each binds, an
/// index into [`PLACEHOLDERS`], in order. A `:name` that is not a placeholder is left
/// for the server to refuse; so is `?` inside a literal or a comment.
fn positional(named: &str) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(named.len());
    let mut binds = Vec::new();
    let mut copied = 0;
    for token in lex(named) {
        if token.kind != Kind::Named {
            continue;
        }
        let name = &named[token.span.start + 1..token.span.end];
        if let Some(n) = PLACEHOLDERS
            .iter()
            .position(|p| p.eq_ignore_ascii_case(name))
        {
            out.push_str(&named[copied..token.span.start]);
            out.push('?');
            copied = token.span.end;
            binds.push(n);
        }
    }
    out.push_str(&named[copied..]);
    (out, binds)
}

/// `name` as a quoted identifier, taken as written.
pub(super) fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The statement ready to prepare: `?` placeholders, what each binds (an index into
/// [`PLACEHOLDERS`]), guarded by `fence_column` when given.
pub(super) fn prepare(
    sql: &str,
    fence_column: Option<&str>,
) -> Result<(String, Vec<usize>), String> {
    let mut text = named(sql)?;
    if let Some(column) = fence_column {
        text = fenced(&text, column)?;
    }
    Ok(positional(&text))
}

/// `sql` (placeholders by name) guarded by `column`: the UPDATE also sets `column` to
/// the chunk's fence, and touches only rows whose `column` is NULL or below it. A
/// worker whose lease was taken over (a higher fence wrote these rows) then updates
/// none of them, and a chunk whose commit was lost on the way back, retried under the
/// same fence, is not applied twice.
///
/// Only a top-level single-table UPDATE can be guarded (`ORDER BY` and `LIMIT` stay
/// after the guard); anything else is an `Err` with the reason.
fn fenced(sql: &str, column: &str) -> Result<String, String> {
    let tokens = lex(sql);
    let mut depth = 0usize;
    // The top-level tokens, outside parentheses, white space and comments.
    let mut top = Vec::new();
    for (n, t) in tokens.iter().enumerate() {
        match t.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.saturating_sub(1),
            Kind::Space | Kind::Comment => {}
            _ if depth == 0 => top.push(n),
            _ => {}
        }
    }
    let text = |n: usize| &sql[tokens[n].span.clone()];
    let word = |n: usize, w: &str| tokens[n].kind == Kind::Word && text(n).eq_ignore_ascii_case(w);
    let not_update = || "a fence column needs the statement to be an UPDATE".to_string();
    let update = top
        .iter()
        .position(|&n| word(n, "update"))
        .ok_or_else(not_update)?;
    if update > 0 && !word(top[0], "with") {
        return Err(not_update());
    }
    let set = top[update..]
        .iter()
        .position(|&n| word(n, "set"))
        .map(|p| update + p)
        .ok_or("the UPDATE has no SET")?;
    let mut target: Vec<usize> = top[update + 1..set].to_vec();
    while target
        .first()
        .is_some_and(|&n| word(n, "low_priority") || word(n, "ignore"))
    {
        target.remove(0);
    }
    if target
        .iter()
        .any(|&n| text(n) == "," || word(n, "join") || tokens[n].kind == Kind::Open)
    {
        return Err("a fence column needs a single-table UPDATE".to_string());
    }
    let reference = match target.as_slice() {
        [] => return Err("the UPDATE names no table".to_string()),
        [.., a, alias] if word(*a, "as") => text(*alias).to_string(),
        [name] => text(*name).to_string(),
        [.., before, alias]
            if tokens[*alias].kind != Kind::Other && tokens[*before].kind != Kind::Other =>
        {
            text(*alias).to_string()
        }
        [first, .., last] => sql[tokens[*first].span.start..tokens[*last].span.end].to_string(),
    };
    let end_at = top.iter().position(|&n| tokens[n].kind == Kind::End);
    if let Some(e) = end_at
        && top[e..].iter().any(|&n| tokens[n].kind != Kind::End)
    {
        return Err("a fence column needs one statement".to_string());
    }
    let end = end_at.map_or(sql.len(), |e| tokens[top[e]].span.start);
    let after_set = &top[set + 1..end_at.unwrap_or(top.len()).max(set + 1)];
    let where_at = after_set.iter().position(|&n| word(n, "where"));
    // The condition ends where ORDER BY or LIMIT starts.
    let tail = after_set[where_at.unwrap_or(0)..]
        .iter()
        .find(|&&n| word(n, "order") || word(n, "limit"))
        .map_or(end, |&n| tokens[n].span.start);
    let column = quote_ident(column);
    let guard = format!("({reference}.{column} IS NULL OR {reference}.{column} < :fence)");
    let set_end = tokens[top[set]].span.end;
    let mut out = String::with_capacity(sql.len() + 2 * guard.len());
    out.push_str(&sql[..set_end]);
    out.push_str(&format!(" {column} = :fence,"));
    match where_at {
        Some(p) => {
            let where_end = tokens[after_set[p]].span.end;
            out.push_str(&sql[set_end..where_end]);
            // The user's condition in parentheses of its own (an OR in it must not
            // escape the guard), closed on a new line (it may end in a comment).
            out.push_str(&format!(" {guard} AND ("));
            out.push_str(&sql[where_end..tail]);
            out.push_str("\n) ");
        }
        None => {
            out.push_str(&sql[set_end..tail]);
            out.push_str(&format!("\nWHERE {guard} "));
        }
    }
    out.push_str(&sql[tail..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(sql: &str, fence: Option<&str>, expect: &str, binds: &[&str]) {
        let (text, got) = prepare(sql, fence).unwrap_or_else(|e| panic!("{sql}: {e}"));
        assert_eq!(text, expect, "{sql}");
        let got: Vec<&str> = got.iter().map(|&n| PLACEHOLDERS[n]).collect();
        assert_eq!(got, binds, "{sql}");
    }

    #[test]
    fn placeholders_become_question_marks_outside_literals_and_comments() {
        check(
            "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to",
            None,
            "UPDATE t SET v = v + 1 WHERE id BETWEEN ? AND ?",
            &["from", "to"],
        );
        check(
            "UPDATE t SET a = $4 WHERE id BETWEEN $1 AND $2",
            None,
            "UPDATE t SET a = ? WHERE id BETWEEN ? AND ?",
            &["attempt", "from", "to"],
        );
        check(
            "UPDATE t SET v = ? WHERE id BETWEEN ? AND ?",
            None,
            "UPDATE t SET v = ? WHERE id BETWEEN ? AND ?",
            &["from", "to", "pid"],
        );
        check(
            r#"UPDATE t SET s = 'it\'s :from ?', `:to` = ":pid", c = '' -- :fence ?
               # :attempt
               /* ? :to */ WHERE id = :TO"#,
            None,
            r#"UPDATE t SET s = 'it\'s :from ?', `:to` = ":pid", c = '' -- :fence ?
               # :attempt
               /* ? :to */ WHERE id = ?"#,
            &["to"],
        );
        // Not placeholders: a session variable assignment, an unknown name, a `$` word.
        check(
            "SELECT @a := 1, :other, a$1 FROM t WHERE id = :pid",
            None,
            "SELECT @a := 1, :other, a$1 FROM t WHERE id = ?",
            &["pid"],
        );
    }

    #[test]
    fn too_many_or_mixed_placeholders_are_refused() {
        assert!(prepare("SELECT ?, ?, ?, ?, ?, ?", None).is_err());
        assert!(prepare("SELECT $6", None).is_err());
        assert!(prepare("SELECT ?, :to", None).is_err());
        assert!(prepare("SELECT '?', :to", None).is_ok());
    }

    #[test]
    fn the_fence_guards_a_single_table_update() {
        check(
            "UPDATE t SET v = v + 1 WHERE id BETWEEN :from AND :to OR id = 0",
            Some("f"),
            "UPDATE t SET `f` = ?, v = v + 1 WHERE (t.`f` IS NULL OR t.`f` < ?) AND ( \
             id BETWEEN ? AND ? OR id = 0\n) ",
            &["fence", "fence", "from", "to"],
        );
        check(
            "UPDATE LOW_PRIORITY db.t AS x SET v = 1 ORDER BY id LIMIT 10;",
            Some("f"),
            "UPDATE LOW_PRIORITY db.t AS x SET `f` = ?, v = 1 \nWHERE (x.`f` IS NULL OR x.`f` < ?) \
             ORDER BY id LIMIT 10;",
            &["fence", "fence"],
        );
        check(
            "UPDATE t SET v = ? WHERE id BETWEEN ? AND ? LIMIT 5",
            Some("f"),
            "UPDATE t SET `f` = ?, v = ? WHERE (t.`f` IS NULL OR t.`f` < ?) AND ( id BETWEEN \
             ? AND ? \n) LIMIT 5",
            &["fence", "from", "fence", "to", "pid"],
        );
        for bad in [
            "DELETE FROM t WHERE id = :from",
            "UPDATE a JOIN b ON a.id = b.id SET a.v = 1",
            "UPDATE a, b SET a.v = 1",
            "UPDATE t SET v = 1; DELETE FROM t",
        ] {
            assert!(prepare(bad, Some("f")).is_err(), "{bad}");
        }
    }
}
