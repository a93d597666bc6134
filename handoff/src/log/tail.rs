//! Reading a handoff log as it grows (`itcpctl handoffs --follow`), as `tail -F` does:
//! new complete lines as they are appended; when the file is rotated (renamed or
//! removed and a new one created under the same name) the rest of the old file and
//! then the new one from its start; when it is truncated in place (logrotate's
//! `copytruncate`), from the start again.
//!
//! A file truncated and then written past the old read position between two polls
//! cannot be told from one that only grew (so it is for `tail` too).

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What [`Tail::poll`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailEvent {
    /// One complete line (without its newline), numbered from 1 in its file.
    Line { number: usize, text: String },
    /// The file got shorter: read again from its start.
    Truncated,
    /// Another file now has the path (rotation): read from its start.
    Reopened,
}

/// A log file followed by name.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    file: Option<File>,
    /// Device and inode of `file`.
    id: (u64, u64),
    pos: u64,
    partial: Vec<u8>,
    lines: usize,
}

impl Tail {
    /// Follows `path`, from its start (the file need not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> Tail {
        Tail {
            path: path.into(),
            file: None,
            id: (0, 0),
            pos: 0,
            partial: Vec::new(),
            lines: 0,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// True while the path has been opened (it existed at some poll).
    pub fn is_open(&self) -> bool {
        self.file.is_some()
    }

    /// What was appended since the last poll (on the first, every line there is). A
    /// line not yet ended by a newline waits for the next poll, unless its file was
    /// rotated away.
    pub fn poll(&mut self) -> io::Result<Vec<TailEvent>> {
        let mut out = Vec::new();
        let named = std::fs::metadata(&self.path)
            .ok()
            .map(|m| ((m.dev(), m.ino()), m.len()));
        if self.file.is_some() {
            match named {
                Some((id, len)) if id == self.id => {
                    if len < self.pos {
                        self.restart();
                        out.push(TailEvent::Truncated);
                    }
                    self.read_new(&mut out)?;
                    return Ok(out);
                }
                _ => {
                    // Rotated or removed: what the old file still holds comes first.
                    self.read_new(&mut out)?;
                    self.end_partial(&mut out);
                    self.file = None;
                    if named.is_some() {
                        out.push(TailEvent::Reopened);
                    }
                }
            }
        }
        if named.is_some() {
            let f = match File::open(&self.path) {
                Ok(f) => f,
                // Gone again between the stat and the open: the next poll sees.
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
                Err(e) => return Err(e),
            };
            let m = f.metadata()?;
            self.id = (m.dev(), m.ino());
            self.file = Some(f);
            self.restart();
            self.read_new(&mut out)?;
        }
        Ok(out)
    }

    /// The last line of the file when it does not end with a newline (at the end of a
    /// one-shot read).
    pub fn finish(&mut self) -> Vec<TailEvent> {
        let mut out = Vec::new();
        self.end_partial(&mut out);
        out
    }

    fn restart(&mut self) {
        self.pos = 0;
        self.lines = 0;
        self.partial.clear();
    }

    fn read_new(&mut self, out: &mut Vec<TailEvent>) -> io::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        f.seek(SeekFrom::Start(self.pos))?;
        let mut buf = Vec::new();
        self.pos += f.read_to_end(&mut buf)? as u64;
        let mut rest = &buf[..];
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..i]);
            rest = &rest[i + 1..];
            let line = std::mem::take(&mut self.partial);
            self.push_line(line, out);
        }
        self.partial.extend_from_slice(rest);
        Ok(())
    }

    fn end_partial(&mut self, out: &mut Vec<TailEvent>) {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.push_line(line, out);
        }
    }

    fn push_line(&mut self, mut line: Vec<u8>, out: &mut Vec<TailEvent>) {
        self.lines += 1;
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        out.push(TailEvent::Line {
            number: self.lines,
            text: String::from_utf8_lossy(&line).into_owned(),
        });
    }
}

/// Every line of a file at once (a one-shot read with the same numbering as [`Tail`]).
pub fn read_lines(path: &Path) -> io::Result<Vec<(usize, String)>> {
    // Opening first: a missing or unreadable file is an error here, not "no lines".
    File::open(path)?;
    let mut t = Tail::new(path);
    let mut ev = t.poll()?;
    ev.extend(t.finish());
    Ok(ev
        .into_iter()
        .filter_map(|e| match e {
            TailEvent::Line { number, text } => Some((number, text)),
            _ => None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn lines(ev: Vec<TailEvent>) -> Vec<String> {
        ev.into_iter()
            .map(|e| match e {
                TailEvent::Line { number, text } => format!("{number}:{text}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn append(p: &Path, s: &str) {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap()
            .write_all(s.as_bytes())
            .unwrap();
    }

    #[test]
    fn follows_appends_rotation_and_truncation() {
        let dir = std::env::temp_dir().join(format!("itcp-tail-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("h.jsonl");
        let mut t = Tail::new(&p);
        // Not there yet.
        assert!(t.poll().unwrap().is_empty() && !t.is_open());
        assert!(read_lines(&p).is_err());
        append(&p, "a\nb\r\npart");
        assert_eq!(lines(t.poll().unwrap()), ["1:a", "2:b"]);
        assert!(t.poll().unwrap().is_empty());
        append(&p, "ial\nc\n");
        assert_eq!(lines(t.poll().unwrap()), ["3:partial", "4:c"]);
        // Rotation: renamed, more written to the old file, a new file under the name.
        std::fs::rename(&p, dir.join("h.jsonl.1")).unwrap();
        append(&dir.join("h.jsonl.1"), "d\nlast");
        assert_eq!(lines(t.poll().unwrap()), ["5:d", "6:last"]);
        append(&p, "e\n");
        assert_eq!(lines(t.poll().unwrap()), ["1:e"]);
        // Rotation seen only once the new file is there.
        std::fs::rename(&p, dir.join("h.jsonl.2")).unwrap();
        append(&p, "f\n");
        assert_eq!(lines(t.poll().unwrap()), ["Reopened", "1:f"]);
        // copytruncate.
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        assert_eq!(lines(t.poll().unwrap()), ["Truncated"]);
        append(&p, "g\n");
        assert_eq!(lines(t.poll().unwrap()), ["1:g"]);
        // Removed: nothing, then a new file.
        std::fs::remove_file(&p).unwrap();
        assert!(t.poll().unwrap().is_empty());
        append(&p, "h\n");
        assert_eq!(lines(t.poll().unwrap()), ["1:h"]);
        // A one-shot read keeps a last line without its newline.
        append(&p, "i");
        assert_eq!(
            read_lines(&p).unwrap(),
            [(1, "h".to_string()), (2, "i".to_string())]
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
