//! What the PostgreSQL (`statement`) and MySQL (`mysql_statement`) rewriters share:
//! the five placeholders, a dialect-neutral token model, and [`fenced`], the one
//! splice that guards an UPDATE by its fence column, told by a [`Dialect`] what
//! differs.
//!
//! Each dialect keeps its own lexer, because what hides text from a rewrite is where
//! the two differ (PostgreSQL's `E'…'`, `$tag$…$tag$`, `::` and `"ident"`; MySQL's
//! backticks, `#` comments, backslash escapes and `"…"` strings); both lexers yield
//! the [`Token`]s below, so the splice never sees which one ran.

use std::ops::Range;

/// The placeholders, in their positional order: `:from` is the first (`$1`), …
/// `:fence` the fifth (`$5`).
pub(super) const PLACEHOLDERS: [&str; 5] = ["from", "to", "pid", "attempt", "fence"];

/// The position of `:fence` (`$5`).
pub(super) const FENCE: usize = 5;

/// What one lexical piece of a statement is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// An unquoted word: a keyword or an identifier.
    Word,
    /// A string or a quoted identifier: nothing inside is rewritten.
    Quoted,
    /// A comment: nothing inside is rewritten, and the splice looks through it.
    Comment,
    /// `:name`, a named placeholder or something the server will refuse.
    Named,
    /// A positional placeholder: `$` and digits, or MySQL's `?`.
    Param,
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// `;`.
    End,
    /// Anything else (operators, numbers, `::`).
    Other,
}

/// One lexical piece of a statement: what it is and its byte range. White space is
/// no token.
pub(super) struct Token {
    /// What the piece is.
    pub(super) kind: Kind,
    /// Where it stands in the statement.
    pub(super) span: Range<usize>,
}

/// What [`fenced`] needs to know of a dialect.
pub(super) struct Dialect {
    /// The dialect's own tokens: given the statement, a position and the tokens
    /// before it, the token there, or `None` for what both dialects read alike
    /// ([`Dialect::lex`]). White space never reaches it.
    pub(super) token: fn(&str, usize, &[Token]) -> Option<Token>,
    /// The fence's placeholder as the statement is written when it is fenced
    /// (PostgreSQL's `$5`, MySQL's `:fence`).
    pub(super) fence: &'static str,
    /// A column name as a quoted identifier, taken as written.
    pub(super) quote_ident: fn(&str) -> String,
    /// Words that may stand between UPDATE and the target and do not name it
    /// (PostgreSQL's `ONLY`, MySQL's `LOW_PRIORITY` and `IGNORE`), any number of them.
    pub(super) modifiers: &'static [&'static str],
    /// Whether a `*` after the target (PostgreSQL: descendant tables too) is dropped
    /// from its name.
    pub(super) star: bool,
    /// Whether an UPDATE of several tables (`a, b`, `a JOIN b`) is refused: MySQL's
    /// syntax for it has no single target the guard could name.
    pub(super) single_table: bool,
    /// Words that end the user's condition; they and what follows stay after the
    /// guard (PostgreSQL's `RETURNING`, MySQL's `ORDER BY` and `LIMIT`).
    pub(super) tail: &'static [&'static str],
}

impl Dialect {
    /// The statement's tokens. Never fails: an unterminated string or comment runs to
    /// the end (the server refuses it). What the dialect does not claim is read alike
    /// in both: white space is skipped, `(`, `)` and `;` are themselves, and anything
    /// else is one byte of [`Kind::Other`] (both dialects read bytes from 0x80 up as
    /// a word's, so this never splits a character).
    pub(super) fn lex(&self, sql: &str) -> Vec<Token> {
        let b = sql.as_bytes();
        let mut out = Vec::new();
        let mut i = 0;
        while i < b.len() {
            if b[i].is_ascii_whitespace() {
                i += 1;
                continue;
            }
            let token = (self.token)(sql, i, &out).unwrap_or_else(|| {
                let kind = match b[i] {
                    b'(' => Kind::Open,
                    b')' => Kind::Close,
                    b';' => Kind::End,
                    _ => Kind::Other,
                };
                Token {
                    kind,
                    span: i..i + 1,
                }
            });
            i = token.span.end;
            out.push(token);
        }
        out
    }
}

/// `sql` with each named placeholder (`:from` … `:fence`, any case) replaced by what
/// `with` makes of its index into [`PLACEHOLDERS`]; any other `:name` is left for the
/// server to refuse.
pub(super) fn replace_named(
    sql: &str,
    tokens: &[Token],
    mut with: impl FnMut(usize) -> String,
) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut copied = 0;
    for token in tokens.iter().filter(|t| t.kind == Kind::Named) {
        let name = &sql[token.span.start + 1..token.span.end];
        if let Some(n) = PLACEHOLDERS
            .iter()
            .position(|p| p.eq_ignore_ascii_case(name))
        {
            out.push_str(&sql[copied..token.span.start]);
            out.push_str(&with(n));
            copied = token.span.end;
        }
    }
    out.push_str(&sql[copied..]);
    out
}

/// `sql` guarded by `column`: the UPDATE also sets `column` to the chunk's fence, and
/// touches only rows whose `column` is NULL or below it. A worker whose lease was
/// taken over (a higher fence wrote these rows) then updates none of them, and a
/// chunk whose commit was lost on the way back, retried under the same fence, is not
/// applied twice.
///
/// Only a top-level UPDATE can be guarded (what ends the condition, such as
/// `RETURNING`, stays after the guard); anything else is an `Err` with the reason.
pub(super) fn fenced(dialect: &Dialect, sql: &str, column: &str) -> Result<String, String> {
    let tokens = dialect.lex(sql);
    let mut depth = 0usize;
    // The top-level tokens, outside parentheses and comments, with their index.
    let mut top = Vec::new();
    for (n, t) in tokens.iter().enumerate() {
        match t.kind {
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.saturating_sub(1),
            Kind::Comment => {}
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
    // or else its written name (`s.t`, `"T"`), the dialect's modifiers aside.
    let mut target = &top[update + 1..set];
    while let [first, rest @ ..] = target
        && dialect.modifiers.iter().any(|m| word(*first, m))
    {
        target = rest;
    }
    if dialect.star
        && let [rest @ .., last] = target
        && text(*last) == "*"
    {
        target = rest;
    }
    if dialect.single_table && target.iter().any(|&n| text(n) == "," || word(n, "join")) {
        return Err("a fence column needs a single-table UPDATE".to_string());
    }
    // Punctuation (`.`) joins a name's parts; two names in a row are a table and its
    // alias.
    let name_part = |n: usize| !matches!(tokens[n].kind, Kind::Other | Kind::Param);
    let reference = match target {
        [] => return Err("the UPDATE names no table".to_string()),
        [.., a, alias] if word(*a, "as") => text(*alias),
        [name] => text(*name),
        [.., before, alias] if name_part(*alias) && name_part(*before) => text(*alias),
        [first, .., last] => &sql[tokens[*first].span.start..tokens[*last].span.end],
    };
    // The statement ends at its first top-level `;`: only more `;` may follow.
    let end_at = top.iter().position(|&n| tokens[n].kind == Kind::End);
    if let Some(e) = end_at
        && top[e..].iter().any(|&n| tokens[n].kind != Kind::End)
    {
        return Err("a fence column needs one statement".to_string());
    }
    let end = end_at.map_or(sql.len(), |e| tokens[top[e]].span.start);
    let after_set = &top[set + 1..end_at.unwrap_or(top.len()).max(set + 1)];
    let where_at = after_set.iter().position(|&n| word(n, "where"));
    let tail = after_set[where_at.unwrap_or(0)..]
        .iter()
        .find(|&&n| dialect.tail.iter().any(|w| word(n, w)))
        .map_or(end, |&n| tokens[n].span.start);
    let (column, fence) = ((dialect.quote_ident)(column), dialect.fence);
    let guard = format!("({reference}.{column} IS NULL OR {reference}.{column} < {fence})");
    let set_end = tokens[top[set]].span.end;
    let mut out = String::with_capacity(sql.len() + 2 * guard.len());
    out.push_str(&sql[..set_end]);
    out.push_str(&format!(" {column} = {fence},"));
    match where_at {
        Some(p) => {
            let where_end = tokens[after_set[p]].span.end;
            out.push_str(&sql[set_end..where_end]);
            // The user's condition in parentheses of its own (an OR in it must not
            // escape the guard), closed on a new line (it may end in a -- comment).
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
    use crate::sql::mysql_statement::MYSQL;
    use crate::sql::statement::POSTGRES;

    /// On text both lexers read alike (words, `'…'`, `:name`, `-- ` and `/* */`
    /// comments), without either dialect's own words, the two dialects' guards differ
    /// only in the fence's placeholder and the identifier quotes.
    #[test]
    fn the_dialects_agree_on_their_shared_part() {
        for sql in [
            "UPDATE t SET v = 1",
            "update s.t set v = 1 where id between :from and :to or false",
            "UPDATE t AS x SET v = 'a''b' WHERE x.id = :pid;",
            "UPDATE t x SET v = (SELECT 1 WHERE true) WHERE /* c */ id = :from -- c\n",
            "WITH w AS (SELECT 1) UPDATE t SET v = 1 WHERE id IN (SELECT 1 FROM w);;",
            "SELECT 1",
            "WITH u AS (UPDATE t SET v = 1) SELECT 1",
            "DELETE FROM t WHERE id = :from; UPDATE t SET v = 1",
            "UPDATE t SET v = 1; DELETE FROM t",
            "UPDATE SET v = 1",
            "UPDATE t",
        ] {
            let postgres = fenced(&POSTGRES, sql, "f")
                .map(|s| s.replace("$5", ":fence").replace("\"f\"", "`f`"));
            assert_eq!(postgres, fenced(&MYSQL, sql, "f"), "{sql}");
        }
    }
}
