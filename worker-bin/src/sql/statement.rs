//! The statement as the server is given it: named placeholders (`:from`, `:to`,
//! `:pid`, `:attempt`, `:fence`) rewritten to positional ones, and, with a fence
//! column, the UPDATE guarded by it.
//!
//! The text is read by a small lexer that knows what SQL hides from a rewrite: string
//! literals (`'…'`, `E'…'`, `$tag$…$tag$`), quoted identifiers, comments and `::`
//! casts. A name outside those is rewritten only when it is one of the five
//! placeholders; anything else (`:name` is no SQL) is left for the server to refuse.
//! The fence's splice is the one MySQL's statements get too (`rewrite`).

use super::rewrite::{self, Dialect, Kind, Token};

/// PostgreSQL as the fence splice needs it: the statement is positional by then, so
/// the fence is `$5`.
pub(super) const POSTGRES: Dialect = Dialect {
    token,
    fence: "$5",
    quote_ident,
    modifiers: &["only"],
    star: true,
    single_table: false,
    tail: &["returning"],
};

fn is_ident_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c >= 0x80
}

fn is_ident(c: u8) -> bool {
    is_ident_start(c) || c.is_ascii_digit() || c == b'$'
}

/// The token at `i`, when it is one this dialect reads its own way;
/// `before` are the tokens so far.
fn token(sql: &str, mut i: usize, before: &[Token]) -> Option<Token> {
    let b = sql.as_bytes();
    let start = i;
    let c = b[i];
    let kind = match c {
        b'\'' => {
            // E'…' takes backslash escapes; the E was lexed as a word before.
            let escapes = matches!(before.last(), Some(Token { kind: Kind::Word, span })
                    if span.end == start && sql[span.clone()].eq_ignore_ascii_case("e"));
            i = quoted(b, i, b'\'', escapes);
            Kind::Quoted
        }
        b'"' => {
            i = quoted(b, i, b'"', false);
            Kind::Quoted
        }
        b'-' if b.get(i + 1) == Some(&b'-') => {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            Kind::Comment
        }
        b'/' if b.get(i + 1) == Some(&b'*') => {
            i = block_comment(b, i);
            Kind::Comment
        }
        b'$' => match dollar_tag(b, i) {
            Some(tag) => {
                let close = &sql[i..i + tag];
                i = sql[i + tag..]
                    .find(close)
                    .map_or(b.len(), |at| i + tag + at + tag);
                Kind::Quoted
            }
            None => {
                i += 1;
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1;
                }
                if i - start > 1 {
                    Kind::Param
                } else {
                    Kind::Other
                }
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
        _ if is_ident_start(c) => {
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            Kind::Word
        }
        _ => return None,
    };
    Some(Token {
        kind,
        span: start..i,
    })
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
pub(super) fn positional(sql: &str) -> (String, usize) {
    let tokens = POSTGRES.lex(sql);
    // `$` and digits: too many to parse is too many anyway.
    let mut highest = tokens
        .iter()
        .filter(|t| t.kind == Kind::Param)
        .map(|t| {
            sql[t.span.start + 1..t.span.end]
                .parse()
                .unwrap_or(usize::MAX)
        })
        .max()
        .unwrap_or(0);
    let out = rewrite::replace_named(sql, &tokens, |n| {
        highest = highest.max(n + 1);
        format!("${}", n + 1)
    });
    (out, highest)
}

/// `sql` (positional already) guarded by `column` ([`rewrite::fenced`]), the fence
/// being `$5`.
pub(super) fn fenced(sql: &str, column: &str) -> Result<String, String> {
    rewrite::fenced(&POSTGRES, sql, column)
}

/// `name` as a quoted identifier: taken as written, case included.
pub(super) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::rewrite::FENCE;

    #[test]
    fn the_fence_placeholder_is_the_fifth() {
        assert_eq!(POSTGRES.fence, format!("${FENCE}"));
    }

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

    /// RETURNING before WHERE is no SQL, but a user may write it: the condition then
    /// runs to the end (the server refuses the statement) rather than ending before it
    /// starts, which sliced backwards and panicked.
    #[test]
    fn a_returning_before_the_where_is_left_for_the_server() {
        assert_eq!(
            fenced("UPDATE t SET v = 1 RETURNING v WHERE id = $1", "f").as_deref(),
            Ok(
                "UPDATE t SET \"f\" = $5, v = 1 RETURNING v WHERE (t.\"f\" IS NULL OR \
                t.\"f\" < $5) AND ( id = $1\n) "
            )
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
