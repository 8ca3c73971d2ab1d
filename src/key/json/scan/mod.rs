//! The quick scan of [`Pointer::seek`](super::Pointer::seek): finds the field and checks the
//! whole document in one pass, with `memchr` over the strings, which are most of a webhook's
//! bytes.
//!
//! It takes on less than JSON allows, never more, and answers what serde_json answers for
//! every document it takes on. Whatever else it meets it gives up on (`None`), and serde_json
//! reads the document again (`seek`): invalid JSON (so that the message is serde_json's), an
//! escape in a member name on the path or in the value found, a number on the path other than
//! a short integer, a `\u` escape of a surrogate, containers nested deeper than [`MAX_DEPTH`].

use std::borrow::Cow;

use super::{Found, array_index};

/// Containers nested deeper than this, on the path or inside a value skipped, are left to
/// serde_json (whose own limit, on the path, is 128).
const MAX_DEPTH: u32 = 64;

/// What is at `tokens` in `body`, if `body` is a JSON document this scan takes on.
pub(super) fn find<'a>(body: &'a [u8], tokens: &[String]) -> Option<Found<'a>> {
    let mut scan = Scan { body, at: 0 };
    let found = scan.on_path(tokens, 0)?;
    scan.whitespace();
    (scan.at == body.len()).then_some(found)
}

struct Scan<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.body.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn eat(&mut self, byte: u8) -> bool {
        let here = self.peek() == Some(byte);
        self.at += usize::from(here);
        here
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        self.eat(byte).then_some(())
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    /// The value here, `tokens` being what is left of the pointer, `depth` containers in.
    fn on_path(&mut self, tokens: &[String], depth: u32) -> Option<Found<'a>> {
        self.whitespace();
        let Some((token, rest)) = tokens.split_first() else {
            return self.leaf();
        };
        if depth >= MAX_DEPTH {
            return None;
        }
        let mut found = Found::Absent;
        match self.peek()? {
            b'{' => {
                self.at += 1;
                self.whitespace();
                if self.eat(b'}') {
                    return Some(found);
                }
                loop {
                    self.whitespace();
                    self.expect(b'"')?;
                    let name = self.plain_str()?;
                    self.whitespace();
                    self.expect(b':')?;
                    // As with serde_json, the last of duplicated names wins.
                    if name == token.as_bytes() {
                        found = self.on_path(rest, depth + 1)?;
                    } else {
                        self.skip_value()?;
                    }
                    self.whitespace();
                    match self.next()? {
                        b',' => {}
                        b'}' => return Some(found),
                        _ => return None,
                    }
                }
            }
            b'[' => {
                self.at += 1;
                self.whitespace();
                if self.eat(b']') {
                    return Some(found);
                }
                let index = array_index(token);
                let mut at = 0;
                loop {
                    if Some(at) == index {
                        found = self.on_path(rest, depth + 1)?;
                    } else {
                        self.skip_value()?;
                    }
                    at += 1;
                    self.whitespace();
                    match self.next()? {
                        b',' => {}
                        b']' => return Some(found),
                        _ => return None,
                    }
                }
            }
            // A scalar, read as at the end of the path: the path goes on past it.
            _ => {
                self.leaf()?;
                Some(found)
            }
        }
    }

    /// The value at the end of the path.
    fn leaf(&mut self) -> Option<Found<'a>> {
        Some(match self.peek()? {
            b'"' => {
                self.at += 1;
                let text = self.plain_str()?;
                Found::Text(Cow::Borrowed(std::str::from_utf8(text).ok()?))
            }
            b'{' => {
                self.skip_value()?;
                Found::Other("an object")
            }
            b'[' => {
                self.skip_value()?;
                Found::Other("an array")
            }
            b't' => {
                self.literal(b"true")?;
                Found::Other("a boolean")
            }
            b'f' => {
                self.literal(b"false")?;
                Found::Other("a boolean")
            }
            b'n' => {
                self.literal(b"null")?;
                Found::Other("null")
            }
            _ => Found::Integer(self.integer()?),
        })
    }

    /// An integer of at most 18 digits, which serde_json reads as a `u64` or an `i64`. Longer
    /// ones, fractions, exponents and `-0` (serde_json reads some of them as floats, and
    /// refuses some that a float cannot hold) are left to serde_json.
    fn integer(&mut self) -> Option<i128> {
        let negative = self.eat(b'-');
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        let digits = &self.body[start..self.at];
        if digits.is_empty() || digits.len() > 18 || digits.len() > 1 && digits[0] == b'0' {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = self.peek() {
            return None;
        }
        let n = digits
            .iter()
            .fold(0, |n, digit| n * 10 + i128::from(digit - b'0'));
        match (negative, n) {
            (true, 0) => None,
            (true, n) => Some(-n),
            (false, n) => Some(n),
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let here = self.body.get(self.at..self.at + word.len())? == word;
        self.at += word.len();
        here.then_some(())
    }

    /// Skips one value, checking it: containers without recursion, strings with `memchr`.
    fn skip_value(&mut self) -> Option<()> {
        // Bit `i` of `objects`: whether the container `i` levels up from the innermost open one
        // is an object (else an array). `depth` of them are open.
        let mut objects = 0u64;
        let mut depth = 0;
        loop {
            self.whitespace();
            match self.next()? {
                b'"' => self.skip_str()?,
                open @ (b'{' | b'[') => {
                    let object = open == b'{';
                    self.whitespace();
                    if !self.eat(if object { b'}' } else { b']' }) {
                        if depth == MAX_DEPTH {
                            return None;
                        }
                        objects = objects << 1 | u64::from(object);
                        depth += 1;
                        if object {
                            self.member_name()?;
                        }
                        continue;
                    }
                }
                b't' => self.literal(b"rue")?,
                b'f' => self.literal(b"alse")?,
                b'n' => self.literal(b"ull")?,
                b'-' | b'0'..=b'9' => {
                    self.at -= 1;
                    self.skip_number()?;
                }
                _ => return None,
            }
            // A value ended: the next one in its container, or the container's end (and maybe
            // more ends).
            loop {
                if depth == 0 {
                    return Some(());
                }
                self.whitespace();
                let object = objects & 1 == 1;
                match self.next()? {
                    b',' if object => {
                        self.member_name()?;
                        break;
                    }
                    b',' => break,
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                objects >>= 1;
                depth -= 1;
            }
        }
    }

    /// `"name":` in an object skipped.
    fn member_name(&mut self) -> Option<()> {
        self.whitespace();
        self.expect(b'"')?;
        self.skip_str()?;
        self.whitespace();
        self.expect(b':')
    }

    /// `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`, of any length: serde_json checks
    /// nothing more of a number it skips.
    fn skip_number(&mut self) -> Option<()> {
        self.eat(b'-');
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.') {
            self.one_or_more_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.one_or_more_digits()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Option<()> {
        let start = self.at;
        self.digits();
        (self.at > start).then_some(())
    }

    /// Skips the rest of a string, after its opening quote.
    fn skip_str(&mut self) -> Option<()> {
        loop {
            let rest = &self.body[self.at..];
            let end = run_end(rest)?;
            self.at += end + 1;
            if rest[end] == b'"' {
                return Some(());
            }
            self.escape()?;
        }
    }

    /// The rest of a string without escapes, after its opening quote: its bytes, checked.
    fn plain_str(&mut self) -> Option<&'a [u8]> {
        let body = self.body;
        let rest = &body[self.at..];
        let end = run_end(rest)?;
        self.at += end + 1;
        (rest[end] == b'"').then_some(&rest[..end])
    }

    /// An escape, after its backslash.
    fn escape(&mut self) -> Option<()> {
        match self.next()? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => {
                let hex = self.body.get(self.at..self.at + 4)?;
                let unit = hex.iter().try_fold(0, |unit, &digit| {
                    Some(unit << 4 | char::from(digit).to_digit(16)?)
                })?;
                self.at += 4;
                (!(0xd800..0xe000).contains(&unit)).then_some(())
            }
            _ => None,
        }
    }
}

/// Where the run of a string's bytes at the start of `rest` ends: at its first `"` or `\`.
/// `None` if there is none, or if the run has a control character (JSON wants them escaped)
/// or is not UTF-8.
fn run_end(rest: &[u8]) -> Option<usize> {
    // A short run (most names and ids) a word at a time, which costs less than setting up
    // memchr: the first byte that is not printable ASCII other than `"` and `\` ends it.
    const ONES: u64 = u64::MAX / 255;
    const HIGH: u64 = ONES << 7;
    let mut at = 0;
    while let Some(word) = rest.get(at..at + 8).filter(|_| at < 32) {
        let mut bytes = [0; 8];
        bytes.copy_from_slice(word);
        let word = u64::from_le_bytes(bytes);
        // A byte's high bit set: it is past ASCII, or below 0x20, or `"`, or `\`; of all the
        // bytes so marked, the lowest is surely one (a borrow only marks bytes above it).
        let quote = word ^ (ONES * u64::from(b'"'));
        let backslash = word ^ (ONES * u64::from(b'\\'));
        let marked = (word
            | word.wrapping_sub(ONES * 0x20)
            | quote.wrapping_sub(ONES) & !quote
            | backslash.wrapping_sub(ONES) & !backslash)
            & HIGH;
        if marked != 0 {
            let end = at + marked.trailing_zeros() as usize / 8;
            if let b'"' | b'\\' = rest[end] {
                return Some(end);
            }
            break;
        }
        at += 8;
    }
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    let run = &rest[..end];
    // Passes without branches, which the compiler vectorises; a closer look only for a run
    // past ASCII.
    let lowest = run.iter().fold(u8::MAX, |low, &byte| low.min(byte));
    let highest = run.iter().fold(0, |high, &byte| high.max(byte));
    if lowest < 0x20 || highest > 0x7f && std::str::from_utf8(run).is_err() {
        return None;
    }
    Some(end)
}

#[cfg(test)]
mod tests;
