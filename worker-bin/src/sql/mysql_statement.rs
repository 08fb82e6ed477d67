//! The statement as MySQL or MariaDB is given it: placeholders (`:from`, `:to`,
//! `:pid`, `:attempt`, `:fence`, `$1`..`$5`, or `?` in that order) rewritten to `?`
//! with the list of what each binds, and, with a fence column, the UPDATE guarded by
//! it.
//!
//! The text is read by a small lexer that knows what MySQL hides from a rewrite: string
//! literals (`'…'` and `"…"`, with backslash escapes and doubled quotes), `` `quoted` ``
//! identifiers, and comments (`-- `, `#`, `/* … */`). The PostgreSQL lexer
//! (`statement`) cannot serve: it knows neither backslash escapes nor backticks, and
//! quotes identifiers with `"`, a string in MySQL. The fence's splice is the one
//! PostgreSQL's statements get too (`rewrite`).

use super::rewrite::{self, Dialect, FENCE, Kind, PLACEHOLDERS, Token};

/// MySQL as the fence splice needs it: the statement has its placeholders by name
/// then, so the fence is `:fence`.
pub(super) const MYSQL: Dialect = Dialect {
    token,
    fence: ":fence",
    quote_ident,
    modifiers: &["low_priority", "ignore"],
    star: false,
    single_table: true,
    tail: &["order", "limit"],
};

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || c >= 0x80
}

/// The token at `i`, when it is one MySQL reads its own way (it needs no look back at
/// the tokens before).
fn token(sql: &str, mut i: usize, _before: &[Token]) -> Option<Token> {
    let b = sql.as_bytes();
    let start = i;
    let c = b[i];
    let kind = match c {
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
                Kind::Param
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
            Kind::Param
        }
        _ => return None,
    };
    Some(Token {
        kind,
        span: start..i,
    })
}

/// The statement with every placeholder written by name (`?` number n and `$n` as the
/// n-th of `:from :to :pid :attempt :fence`). Mixing `?` with names is refused, and so
/// is a sixth `?` or a `$6`: a chunk binds five values.
fn named(sql: &str) -> Result<String, String> {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut copied = 0;
    let (mut questions, mut names) = (0usize, false);
    for token in MYSQL.lex(sql) {
        let text = &sql[token.span.clone()];
        let n = match token.kind {
            Kind::Param if text == "?" => {
                questions += 1;
                questions
            }
            Kind::Param => {
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
    let mut binds = Vec::new();
    let out = rewrite::replace_named(named, &MYSQL.lex(named), |n| {
        binds.push(n);
        "?".to_string()
    });
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

/// `sql` (placeholders by name) guarded by `column` ([`rewrite::fenced`]), the fence
/// being `:fence`. Only a single-table UPDATE can be guarded; `ORDER BY` and `LIMIT`
/// stay after the guard.
fn fenced(sql: &str, column: &str) -> Result<String, String> {
    rewrite::fenced(&MYSQL, sql, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_placeholder_is_the_fifth() {
        assert_eq!(MYSQL.fence, format!(":{}", PLACEHOLDERS[FENCE - 1]));
    }

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
