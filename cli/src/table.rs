//! Plain-text tables for terminals: columns as wide as their content (or a minimum),
//! two spaces apart, numbers right-aligned, and text wrapped under a row when it would
//! not fit the width a terminal is assumed to have.

/// One column of a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub header: &'static str,
    /// The narrowest it gets (at least the header's width).
    pub min: usize,
    /// Right-aligned (numbers).
    pub right: bool,
}

impl Column {
    pub const fn left(header: &'static str, min: usize) -> Column {
        Column {
            header,
            min,
            right: false,
        }
    }
    pub const fn right(header: &'static str, min: usize) -> Column {
        Column {
            header,
            min,
            right: true,
        }
    }
}

/// The width terminal tables are laid out for unless asked otherwise.
pub const WIDTH: usize = 120;

fn chars(s: &str) -> usize {
    s.chars().count()
}

/// Each column's minimum: its `min` or its header, whichever is wider.
pub fn min_widths(cols: &[Column]) -> Vec<usize> {
    cols.iter().map(|c| c.min.max(chars(c.header))).collect()
}

/// Each column as wide as its widest cell (and at least its minimum).
pub fn widths(cols: &[Column], rows: &[Vec<String>]) -> Vec<usize> {
    let mut w = min_widths(cols);
    for r in rows {
        for (w, c) in w.iter_mut().zip(r) {
            *w = (*w).max(chars(c));
        }
    }
    w
}

/// One line of cells at these widths, without trailing spaces.
pub fn line(cols: &[Column], cells: &[String], widths: &[usize]) -> String {
    let mut s = String::new();
    for (i, ((c, w), col)) in cells.iter().zip(widths).zip(cols).enumerate() {
        if i > 0 {
            s.push_str("  ");
        }
        let pad = w.saturating_sub(chars(c));
        if col.right {
            s.extend(std::iter::repeat_n(' ', pad));
            s.push_str(c);
        } else {
            s.push_str(c);
            s.extend(std::iter::repeat_n(' ', pad));
        }
    }
    s.truncate(s.trim_end().len());
    s
}

/// The header line at these widths.
pub fn header(cols: &[Column], widths: &[usize]) -> String {
    let h: Vec<String> = cols.iter().map(|c| c.header.to_string()).collect();
    line(cols, &h, widths)
}

/// `text` filled into lines of at most `width` columns, each starting with `indent`
/// spaces (a word longer than a line gets a line of its own). Lines break at ASCII
/// spaces and newlines only: a no-break space keeps a figure with its unit.
pub fn wrap(text: &str, indent: usize, width: usize) -> Vec<String> {
    let room = width.saturating_sub(indent).max(1);
    let mut out = Vec::new();
    let mut cur = String::new();
    for w in text.split([' ', '\n', '\t']).filter(|w| !w.is_empty()) {
        if !cur.is_empty() && chars(&cur) + 1 + chars(w) > room {
            out.push(format!("{:indent$}{cur}", ""));
            cur.clear();
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        out.push(format!("{:indent$}{cur}", ""));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const COLS: [Column; 3] = [
        Column::left("name", 0),
        Column::right("n", 4),
        Column::left("note", 0),
    ];

    #[test]
    fn columns_fit_their_content_and_numbers_align_right() {
        let rows = vec![
            vec!["a".to_string(), "1".into(), "x".into()],
            vec!["longer".to_string(), "12345".into(), "".into()],
        ];
        let w = widths(&COLS, &rows);
        assert_eq!(w, [6, 5, 4]);
        assert_eq!(header(&COLS, &w), "name        n  note");
        assert_eq!(line(&COLS, &rows[0], &w), "a           1  x");
        assert_eq!(line(&COLS, &rows[1], &w), "longer  12345");
    }

    #[test]
    fn wrapping_keeps_every_line_within_the_width() {
        let text = "old: no connection resumed at the new MSR; new: no connection resumed here";
        let lines = wrap(text, 4, 30);
        assert!(lines.iter().all(|l| l.chars().count() <= 30), "{lines:#?}");
        assert!(lines.iter().all(|l| l.starts_with("    ")));
        let joined: Vec<&str> = lines.iter().flat_map(|l| l.split_whitespace()).collect();
        assert_eq!(joined.join(" "), text);
        assert!(wrap("", 2, 10).is_empty());
    }
}
