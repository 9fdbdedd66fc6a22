//! Arrays from PostgreSQL's text form (`array_out`), element by element
//! in the element type's own parser.

use super::{PgType, Value, ValueError};

/// Parses an array in the grammar of PostgreSQL's `array_in` ("Array
/// Value Input" in the documentation): optional dimension decoration
/// (`[0:1]=`), braces, elements separated by commas, each either quoted
/// (`"a, {b}"`, backslash escapes inside) or unquoted (surrounding
/// whitespace dropped, backslash escapes, `NULL` in any case a null),
/// whitespace allowed around every token.
///
/// An array with the default lower bounds (or an empty one) whose
/// dimensions are those of `element`'s nesting (an `int[][]` column is an
/// array of arrays of int) is an [`Value::Array`] of its decoded elements,
/// nested as deep. Any other array, of other dimensions or with explicit
/// lower bounds, is kept as its exact text, [`Value::Unknown`]: the lake
/// stores such a value verbatim (docs/values.md). The outer `Option` is
/// the array syntax, the inner `Result` an element.
pub(super) fn parse_array(element: &PgType, text: &str) -> Option<Result<Value, ValueError>> {
    let mut parser = ArrayParser {
        input: text.as_bytes(),
        at: 0,
    };
    parser.skip_space();
    let default_bounds = parser.dimensions()?;
    let items = parser.array(0)?;
    parser.skip_space();
    if parser.at != parser.input.len() {
        return None;
    }
    match default_bounds {
        true => {
            Some(array_value(element, items).unwrap_or_else(|| Ok(Value::Unknown(text.to_owned()))))
        }
        false => Some(Ok(Value::Unknown(text.to_owned()))),
    }
}

/// The items of one level as values of `element`; `None` when their
/// nesting is not `element`'s.
pub(super) fn array_value(
    element: &PgType,
    items: Vec<ArrayItem>,
) -> Option<Result<Value, ValueError>> {
    let mut values = Vec::with_capacity(items.len());
    for item in items {
        let value = match (element, item) {
            (PgType::Array(inner), ArrayItem::Nested(items)) => array_value(inner, items)?,
            (PgType::Array(_), ArrayItem::Scalar(_)) | (_, ArrayItem::Nested(_)) => return None,
            (_, ArrayItem::Scalar(Some(text))) => element.parse(&text),
            (_, ArrayItem::Scalar(None)) => Ok(Value::Null),
        };
        match value {
            Ok(value) => values.push(value),
            Err(e) => return Some(Err(e)),
        }
    }
    Some(Ok(Value::Array(values)))
}

/// An element as written: a scalar's unescaped text (`None` for NULL), or
/// a nested array's items, which make the array multi-dimensional.
pub(super) enum ArrayItem {
    Scalar(Option<String>),
    Nested(Vec<ArrayItem>),
}

pub(super) struct ArrayParser<'a> {
    input: &'a [u8],
    at: usize,
}

/// The white space `array_in` skips (`scanner_isspace`).
pub(super) fn is_array_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | b'\x0b' | b'\x0c')
}

impl ArrayParser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(is_array_space) {
            self.at += 1;
        }
    }

    fn eat(&mut self, b: u8) -> Option<()> {
        self.skip_space();
        (self.peek()? == b).then(|| self.at += 1)
    }

    fn integer(&mut self) -> Option<i64> {
        self.skip_space();
        let start = self.at;
        if matches!(self.peek(), Some(b'-' | b'+')) {
            self.at += 1;
        }
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.at += 1;
        }
        std::str::from_utf8(&self.input[start..self.at])
            .ok()?
            .parse()
            .ok()
    }

    /// The optional `[lower:upper]...=` decoration; true when every lower
    /// bound is 1 (or there is none).
    fn dimensions(&mut self) -> Option<bool> {
        let mut default = true;
        let mut any = false;
        while self.peek() == Some(b'[') {
            self.at += 1;
            any = true;
            let first = self.integer()?;
            self.skip_space();
            let lower = if self.peek() == Some(b':') {
                self.at += 1;
                self.integer()?;
                first
            } else {
                1
            };
            default &= lower == 1;
            self.eat(b']')?;
            self.skip_space();
        }
        if any {
            self.eat(b'=')?;
            self.skip_space();
        }
        Some(default)
    }

    /// A braced array at nesting `depth` (0 outermost), the parser at its
    /// `{`; PostgreSQL's arrays have at most six dimensions (`MAXDIM`).
    fn array(&mut self, depth: usize) -> Option<Vec<ArrayItem>> {
        if depth >= 6 {
            return None;
        }
        self.eat(b'{')?;
        let mut items = Vec::new();
        self.skip_space();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(items);
        }
        loop {
            self.skip_space();
            items.push(if self.peek()? == b'{' {
                ArrayItem::Nested(self.array(depth + 1)?)
            } else {
                ArrayItem::Scalar(self.scalar()?)
            });
            self.skip_space();
            match self.peek()? {
                b',' => self.at += 1,
                b'}' => {
                    self.at += 1;
                    return Some(items);
                }
                _ => return None,
            }
        }
    }

    /// One element's unescaped text; `None` inside for an unquoted NULL.
    fn scalar(&mut self) -> Option<Option<String>> {
        let mut out = Vec::new();
        if self.peek()? == b'"' {
            self.at += 1;
            loop {
                match self.peek()? {
                    b'"' => break,
                    b'\\' => {
                        self.at += 1;
                        out.push(self.peek()?);
                    }
                    b => out.push(b),
                }
                self.at += 1;
            }
            self.at += 1;
            return Some(Some(String::from_utf8(out).ok()?));
        }
        // Unquoted: up to a comma or brace; trailing white space that was
        // not escaped is dropped.
        let mut kept = 0;
        let mut escaped = false;
        loop {
            match self.peek()? {
                b',' | b'}' => break,
                b'{' | b'"' => return None,
                b'\\' => {
                    self.at += 1;
                    out.push(self.peek()?);
                    kept = out.len();
                    escaped = true;
                }
                b => {
                    out.push(b);
                    if !is_array_space(b) {
                        kept = out.len();
                    }
                }
            }
            self.at += 1;
        }
        out.truncate(kept);
        if out.is_empty() {
            return None;
        }
        if !escaped && out.eq_ignore_ascii_case(b"NULL") {
            return Some(None);
        }
        Some(Some(String::from_utf8(out).ok()?))
    }
}
