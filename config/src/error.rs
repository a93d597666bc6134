//! [`ConfigError`]: what went wrong loading a config file, and where.

use std::fmt;
use std::io;

/// The broad class of a [`ConfigError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Io,
    /// The text is not valid TOML.
    Syntax,
    /// A key the schema does not know (often a typo).
    UnknownKey,
    /// A required key is absent (or empty where it must not be).
    MissingKey,
    /// A value of the wrong TOML type (a string where a number belongs, ...).
    WrongType,
    /// A value of the right type that is out of range or inconsistent.
    InvalidValue,
}

/// A config file error naming the file, the key (a dotted path such as
/// `access.mh_prefixes[1]`), the position when known, and what is wrong.
///
/// `Display` gives one line:
/// `FILE: line L, column C: KEY: MESSAGE` (position and key when known); for an unknown
/// key the message itself names the key and its section:
/// `FILE: line L, column C: unknown key "x" in [access] (expected one of: ...)`.
#[derive(Debug)]
pub struct ConfigError {
    origin: String,
    kind: ConfigErrorKind,
    key: Option<String>,
    position: Option<(usize, usize)>,
    message: String,
    source: Option<io::Error>,
}

impl ConfigError {
    pub(crate) fn new(origin: &str, kind: ConfigErrorKind, message: impl Into<String>) -> Self {
        ConfigError {
            origin: origin.to_owned(),
            kind,
            key: None,
            position: None,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn io(origin: &str, err: io::Error) -> Self {
        let mut e = ConfigError::new(origin, ConfigErrorKind::Io, format!("cannot read: {err}"));
        e.source = Some(err);
        e
    }

    pub(crate) fn with_key(mut self, key: Option<String>) -> Self {
        self.key = key.filter(|k| !k.is_empty());
        self
    }

    pub(crate) fn with_position(mut self, position: Option<(usize, usize)>) -> Self {
        self.position = position;
        self
    }

    /// The file name (or origin name given to `from_str`).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The class of error.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The dotted key path the error is about (`relay.pipe_size`, `cell[1].interface`),
    /// when it is about one key.
    pub fn key(&self) -> Option<&str> {
        self.key.as_deref()
    }

    /// 1-based line and column (in characters) in the file, when known.
    pub fn position(&self) -> Option<(usize, usize)> {
        self.position
    }

    /// What is wrong, without the file, position and key prefix.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.origin)?;
        if let Some((line, column)) = self.position {
            write!(f, "line {line}, column {column}: ")?;
        }
        match (&self.key, self.kind) {
            // The unknown-key message already names the key and its section.
            (Some(key), kind) if kind != ConfigErrorKind::UnknownKey => write!(f, "{key}: ")?,
            _ => {}
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|e| e as _)
    }
}

/// 1-based line and column (counting characters) of byte offset `offset` in `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

/// Turns a `expected one of `a`, `b`` list from serde into `a, b`.
fn backticked_list(s: &str) -> String {
    s.split('`')
        .skip(1)
        .step_by(2)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Describes what serde calls `u16`, `a sequence`, ... in operator terms.
fn expected_phrase(expected: &str) -> String {
    match expected {
        "u8" => "an integer 0..=255".into(),
        "u16" => "an integer 0..=65535".into(),
        "u32" => "an integer 0..=4294967295".into(),
        "u64" | "usize" => "a non-negative integer".into(),
        "i64" | "i32" => "an integer".into(),
        "a boolean" => "true or false".into(),
        "a sequence" => "an array".into(),
        "a map" => "a table".into(),
        s if s.starts_with("struct ") => "a table".into(),
        s if s.starts_with("enum ") => "one of the allowed words".into(),
        s => s.into(),
    }
}

fn found_phrase(found: &str) -> String {
    match found {
        "map" => "a table".into(),
        "sequence" => "an array".into(),
        s => s.replace('`', ""),
    }
}

/// A serde/toml error message split into our kind and a clearer message.
pub(crate) enum SerdeMessage {
    UnknownField {
        field: String,
        expected: String,
    },
    MissingField {
        field: String,
    },
    Other {
        kind: ConfigErrorKind,
        message: String,
    },
}

/// Recognises serde's standard messages (`unknown field`, `invalid type`, ...) and
/// rewrites them in operator terms; custom messages pass through as invalid values.
pub(crate) fn classify(msg: &str) -> SerdeMessage {
    let msg = msg.trim();
    if let Some(rest) = msg.strip_prefix("unknown field `") {
        if let Some((field, tail)) = rest.split_once('`') {
            let expected = if tail.contains("there are no fields") {
                "none".to_owned()
            } else {
                backticked_list(tail)
            };
            return SerdeMessage::UnknownField {
                field: field.to_owned(),
                expected,
            };
        }
    }
    if let Some(rest) = msg.strip_prefix("missing field `") {
        if let Some((field, _)) = rest.split_once('`') {
            return SerdeMessage::MissingField {
                field: field.to_owned(),
            };
        }
    }
    if let Some(rest) = msg.strip_prefix("unknown variant `") {
        if let Some((variant, tail)) = rest.split_once('`') {
            return SerdeMessage::Other {
                kind: ConfigErrorKind::InvalidValue,
                message: format!(
                    "{variant:?} is not a valid value (expected one of: {})",
                    backticked_list(tail)
                ),
            };
        }
    }
    if let Some(rest) = msg.strip_prefix("invalid type: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            return SerdeMessage::Other {
                kind: ConfigErrorKind::WrongType,
                message: format!(
                    "wrong type: expected {}, found {}",
                    expected_phrase(expected),
                    found_phrase(found)
                ),
            };
        }
    }
    if let Some(rest) = msg.strip_prefix("invalid value: ") {
        if let Some((found, expected)) = rest.split_once(", expected ") {
            let found = found_phrase(found);
            let found = found.strip_prefix("integer ").unwrap_or(&found);
            return SerdeMessage::Other {
                kind: ConfigErrorKind::InvalidValue,
                message: format!(
                    "{found} is out of range (expected {})",
                    expected_phrase(expected)
                ),
            };
        }
    }
    SerdeMessage::Other {
        kind: ConfigErrorKind::InvalidValue,
        message: msg.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters() {
        let t = "a = 1\nbé = 2\n";
        assert_eq!(line_col(t, 0), (1, 1));
        assert_eq!(line_col(t, 6), (2, 1));
        assert_eq!(line_col(t, t.find('=').unwrap()), (1, 3));
        assert_eq!(line_col(t, t.rfind('=').unwrap()), (2, 4));
    }

    #[test]
    fn rewrites_serde_messages() {
        match classify("unknown field `x`, expected one of `a`, `b`") {
            SerdeMessage::UnknownField { field, expected } => {
                assert_eq!(field, "x");
                assert_eq!(expected, "a, b");
            }
            _ => panic!(),
        }
        match classify("invalid type: string \"abc\", expected u16") {
            SerdeMessage::Other { kind, message } => {
                assert_eq!(kind, ConfigErrorKind::WrongType);
                assert_eq!(
                    message,
                    "wrong type: expected an integer 0..=65535, found string \"abc\""
                );
            }
            _ => panic!(),
        }
        match classify("invalid value: integer `-1`, expected u32") {
            SerdeMessage::Other { message, .. } => {
                assert_eq!(
                    message,
                    "-1 is out of range (expected an integer 0..=4294967295)"
                )
            }
            _ => panic!(),
        }
    }
}
