//! Loading machinery shared by both schemas: TOML parsing, a map from key paths to
//! positions in the text, and turning toml/serde errors into [`ConfigError`]s that name
//! the key.

use std::fmt;
use std::ops::Range;

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::{classify, line_col, ConfigError, ConfigErrorKind, SerdeMessage};

// How `toml` hands out positions: a type that asks for a struct with these (unstable,
// but long-standing) serde_spanned names receives a map of start, end and value when the
// value has a position, and the plain value otherwise. `toml::Spanned` itself fails on
// values without a position (the implicit tables of dotted keys), so the tree below asks
// for them directly and accepts both answers. Were the names ever to change, positions
// would silently vanish; the error tests check that keys are still named.
const SPANNED_NAME: &str = "$__serde_spanned_private_Spanned";
const SPANNED_START: &str = "$__serde_spanned_private_start";
const SPANNED_END: &str = "$__serde_spanned_private_end";
const SPANNED_VALUE: &str = "$__serde_spanned_private_value";
const SPANNED_FIELDS: &[&str] = &[SPANNED_START, SPANNED_END, SPANNED_VALUE];
/// Key prefix toml uses to pass datetimes through serde.
const TOML_PRIVATE: &str = "$__toml_private";

/// A TOML value (or key) and its position in the text, when toml knows it.
struct Node<T> {
    span: Option<Range<usize>>,
    value: T,
}

/// A TOML value reduced to its shape.
enum Tree {
    Table(Vec<(Node<String>, Node<Tree>)>),
    Array(Vec<Node<Tree>>),
    Leaf,
}

/// Reads the rest of a positioned value (start, end, value) once its start key is read.
fn spanned_rest<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
    mut map: A,
) -> Result<Node<T>, A::Error> {
    let start: usize = map.next_value()?;
    let mut end = start;
    let mut value = None;
    while let Some(key) = map.next_key::<String>()? {
        match key.as_str() {
            SPANNED_END => end = map.next_value()?,
            SPANNED_VALUE => value = Some(map.next_value()?),
            _ => return Err(de::Error::custom("unexpected key in a positioned value")),
        }
    }
    let value = value.ok_or_else(|| de::Error::custom("positioned value without a value"))?;
    Ok(Node {
        span: Some(start..end),
        value,
    })
}

impl<'de> Deserialize<'de> for Node<String> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Node<String>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a TOML key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Node {
                    span: None,
                    value: v.to_owned(),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                match map.next_key::<String>()? {
                    Some(k) if k == SPANNED_START => spanned_rest(map),
                    _ => Err(de::Error::custom("a key that is a table")),
                }
            }
        }
        deserializer.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for Node<Tree> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node<Tree>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any TOML value")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                TreeVisitor.visit_bool(v).map(unpositioned)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                TreeVisitor.visit_i64(v).map(unpositioned)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                TreeVisitor.visit_u64(v).map(unpositioned)
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
                TreeVisitor.visit_f64(v).map(unpositioned)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                TreeVisitor.visit_str(v).map(unpositioned)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                TreeVisitor.visit_seq(seq).map(unpositioned)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let Some(first) = map.next_key::<Node<String>>()? else {
                    return Ok(unpositioned(Tree::Table(Vec::new())));
                };
                if first.value == SPANNED_START {
                    return spanned_rest(map);
                }
                // A table without a position of its own (e.g. `relay` in
                // `relay.splice = true`).
                TreeVisitor::table_from(first, map).map(unpositioned)
            }
        }
        deserializer.deserialize_struct(SPANNED_NAME, SPANNED_FIELDS, NodeVisitor)
    }
}

fn unpositioned(value: Tree) -> Node<Tree> {
    Node { span: None, value }
}

struct TreeVisitor;

impl<'de> TreeVisitor {
    /// Reads the rest of a table whose first key has been read.
    fn table_from<A: MapAccess<'de>>(first: Node<String>, mut map: A) -> Result<Tree, A::Error> {
        if first.value.starts_with(TOML_PRIVATE) {
            // A datetime: no key of ours takes one, so its shape is all that matters.
            map.next_value::<de::IgnoredAny>()?;
            return Ok(Tree::Leaf);
        }
        let mut entries = vec![(first, map.next_value()?)];
        while let Some(key) = map.next_key()? {
            entries.push((key, map.next_value()?));
        }
        Ok(Tree::Table(entries))
    }
}

impl<'de> Visitor<'de> for TreeVisitor {
    type Value = Tree;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any TOML value")
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Tree, E> {
        Ok(Tree::Leaf)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Tree, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Tree::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Tree, A::Error> {
        match map.next_key()? {
            Some(first) => TreeVisitor::table_from(first, map),
            None => Ok(Tree::Table(Vec::new())),
        }
    }
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Tree, D::Error> {
        deserializer.deserialize_any(TreeVisitor)
    }
}

/// One key (or array element) of the document.
struct Entry {
    /// Path of the enclosing table or array ("" for the top level).
    parent: String,
    /// Full dotted path, e.g. `access.mh_prefixes[1]`.
    path: String,
    key_span: Option<Range<usize>>,
    value_span: Option<Range<usize>>,
}

/// Where every key path of a parsed document sits in the text.
pub(crate) struct Positions {
    entries: Vec<Entry>,
}

/// Quotes a key that is not a bare TOML key.
fn key_segment(key: &str) -> String {
    if !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// Appends a key to a dotted path.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key_segment(key)
    } else {
        format!("{parent}.{}", key_segment(key))
    }
}

impl Positions {
    fn flatten(&mut self, parent: &str, tree: &Tree) {
        match tree {
            Tree::Table(entries) => {
                for (key, value) in entries {
                    let path = join(parent, &key.value);
                    self.entries.push(Entry {
                        parent: parent.to_owned(),
                        path: path.clone(),
                        key_span: key.span.clone(),
                        value_span: value.span.clone(),
                    });
                    self.flatten(&path, &value.value);
                }
            }
            Tree::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let path = format!("{parent}[{i}]");
                    self.entries.push(Entry {
                        parent: parent.to_owned(),
                        path: path.clone(),
                        key_span: item.span.clone(),
                        value_span: item.span.clone(),
                    });
                    self.flatten(&path, &item.value);
                }
            }
            Tree::Leaf => {}
        }
    }

    /// The innermost key or value whose text contains `span`.
    fn entry_at(&self, span: &Range<usize>) -> Option<&Entry> {
        let within = |r: &Range<usize>| r.start <= span.start && span.end <= r.end;
        // On a tie (an array of tables and its first table share the header's span)
        // the later, deeper entry wins.
        let mut best: Option<(&Entry, usize)> = None;
        for e in &self.entries {
            for r in [&e.key_span, &e.value_span].into_iter().flatten() {
                if within(r) && best.is_none_or(|(_, len)| r.end - r.start <= len) {
                    best = Some((e, r.end - r.start));
                }
            }
        }
        best.map(|(e, _)| e)
    }

    fn entry(&self, path: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.path == path)
    }
}

/// How a section is named in messages: `[access]`, `cell[1]`, or `the top level`.
pub(crate) fn section_label(path: &str) -> String {
    if path.is_empty() {
        "the top level".to_owned()
    } else if path.ends_with(']') {
        path.to_owned()
    } else {
        format!("[{path}]")
    }
}

/// A file being loaded: its name, its text and (once parsed) key positions. Builds
/// errors that carry the position of the key they name.
pub(crate) struct Source<'a> {
    pub(crate) origin: &'a str,
    text: &'a str,
    positions: Option<Positions>,
}

impl<'a> Source<'a> {
    /// Parses `text` into `T`, reporting syntax and schema errors with file, position
    /// and key.
    pub(crate) fn parse<T: DeserializeOwned>(
        origin: &'a str,
        text: &'a str,
    ) -> Result<(T, Source<'a>), ConfigError> {
        let mut source = Source {
            origin,
            text,
            positions: None,
        };
        if let Err(e) = text.parse::<toml::Table>() {
            let position = e.span().map(|s| line_col(text, s.start));
            return Err(ConfigError::new(
                origin,
                ConfigErrorKind::Syntax,
                format!("invalid TOML: {}", e.message().trim().replace('\n', "; ")),
            )
            .with_position(position));
        }
        // Cannot fail on text that parsed above; if it did, errors would still have a
        // position, just no key path.
        if let Ok(tree) = toml::from_str::<Tree>(text) {
            let mut positions = Positions {
                entries: Vec::new(),
            };
            positions.flatten("", &tree);
            source.positions = Some(positions);
        }
        match toml::from_str::<T>(text) {
            Ok(value) => Ok((value, source)),
            Err(e) => Err(source.schema_error(&e)),
        }
    }

    fn schema_error(&self, e: &toml::de::Error) -> ConfigError {
        let span = e.span();
        let entry = match (&self.positions, &span) {
            (Some(p), Some(span)) => p.entry_at(span),
            _ => None,
        };
        let position = span.as_ref().map(|s| line_col(self.text, s.start));
        match classify(e.message()) {
            SerdeMessage::UnknownField { field, expected } => {
                // The error span is the unknown key itself.
                let (path, place) = match entry {
                    Some(en) if en.parent.is_empty() => {
                        (en.path.clone(), " at the top level".to_owned())
                    }
                    Some(en) => (
                        en.path.clone(),
                        format!(" in {}", section_label(&en.parent)),
                    ),
                    None => (field.clone(), String::new()),
                };
                ConfigError::new(
                    self.origin,
                    ConfigErrorKind::UnknownKey,
                    format!("unknown key {field:?}{place} (expected one of: {expected})"),
                )
                .with_key(Some(path))
                .with_position(position)
            }
            SerdeMessage::MissingField { field } => {
                // The error span is the table that lacks the key.
                let table = entry.map(|en| en.path.as_str()).unwrap_or("");
                ConfigError::new(
                    self.origin,
                    ConfigErrorKind::MissingKey,
                    format!("required key is missing from {}", section_label(table)),
                )
                .with_key(Some(join(table, &field)))
                .with_position(position)
            }
            SerdeMessage::Other { kind, message } => ConfigError::new(self.origin, kind, message)
                .with_key(entry.map(|en| en.path.clone()))
                .with_position(position),
        }
    }

    /// An error about the key at `path`, positioned at its value when it is in the file
    /// (or at the nearest enclosing key that is).
    pub(crate) fn error(
        &self,
        kind: ConfigErrorKind,
        path: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        let mut position = None;
        if let Some(positions) = &self.positions {
            let mut p = path;
            loop {
                if let Some(span) = positions
                    .entry(p)
                    .and_then(|en| en.value_span.as_ref().or(en.key_span.as_ref()))
                {
                    position = Some(line_col(self.text, span.start));
                    break;
                }
                match p.rfind(['.', '[']) {
                    Some(i) => p = &p[..i],
                    None => break,
                }
            }
        }
        ConfigError::new(self.origin, kind, message)
            .with_key(Some(path.to_owned()))
            .with_position(position)
    }

    /// An [`ConfigErrorKind::InvalidValue`] error about `path`.
    pub(crate) fn invalid(&self, path: &str, message: impl Into<String>) -> ConfigError {
        self.error(ConfigErrorKind::InvalidValue, path, message)
    }
}

/// Reads a config file; the error names the file.
pub(crate) fn read(path: &std::path::Path) -> Result<(String, String), ConfigError> {
    let origin = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((origin, text)),
        Err(e) => Err(ConfigError::io(&origin, e)),
    }
}

/// `deserialize_with` helpers with operator-friendly messages.
pub(crate) mod de_helpers {
    use std::fmt;
    use std::net::IpAddr;

    use serde::de::{self, Deserializer, Visitor};
    use serde::Deserialize;

    /// A TCP port, 1..=65535.
    pub(crate) fn port<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
        Port::deserialize(d).map(|p| p.0)
    }

    /// A list of TCP ports.
    pub(crate) fn ports<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u16>, D::Error> {
        Vec::<Port>::deserialize(d).map(|v| v.into_iter().map(|p| p.0).collect())
    }

    /// A list of IP addresses.
    pub(crate) fn ip_addrs<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpAddr>, D::Error> {
        Vec::<Ip>::deserialize(d).map(|v| v.into_iter().map(|p| p.0).collect())
    }

    struct Port(u16);

    impl<'de> Deserialize<'de> for Port {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Port, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Port;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a TCP port number 1..=65535")
                }
                fn visit_i64<E: de::Error>(self, v: i64) -> Result<Port, E> {
                    match u16::try_from(v) {
                        Ok(p) if p != 0 => Ok(Port(p)),
                        _ => Err(E::custom(format_args!(
                            "{v} is not a valid TCP port (expected 1..=65535)"
                        ))),
                    }
                }
                fn visit_u64<E: de::Error>(self, v: u64) -> Result<Port, E> {
                    self.visit_i64(i64::try_from(v).unwrap_or(i64::MAX))
                }
            }
            d.deserialize_u16(V)
        }
    }

    struct Ip(IpAddr);

    impl<'de> Deserialize<'de> for Ip {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ip, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Ip;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("an IP address string like \"10.2.0.1\" or \"2001:db8::1\"")
                }
                fn visit_str<E: de::Error>(self, v: &str) -> Result<Ip, E> {
                    v.parse().map(Ip).map_err(|_| {
                        E::custom(format_args!(
                            "{v:?} is not an IP address (expected e.g. \"10.2.0.1\" or \"2001:db8::1\")"
                        ))
                    })
                }
            }
            d.deserialize_str(V)
        }
    }
}
