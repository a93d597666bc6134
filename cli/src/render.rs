//! `--help` text and man page, both from the [`Spec`] table.

use std::fmt::Write as _;

use crate::{Command, Flag, Spec};

const WIDTH: usize = 80;
/// Column of flag descriptions in `--help`.
const FLAG_COL: usize = 26;

/// Paragraphs of a text: `(literal, lines)`. A paragraph whose lines all start with two
/// spaces is literal (kept as is, minus that indentation); others are words to fill.
/// So is one of several lines whose lines after the first do: a string that opens with
/// a `\` line continuation (`body: "\` then the lines) has lost its first line's
/// indentation to it.
fn paragraphs(text: &str) -> Vec<(bool, Vec<&str>)> {
    let indented = |l: &&str| l.starts_with("  ") || l.is_empty();
    text.split("\n\n")
        .map(|p| p.trim_matches('\n'))
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let lines: Vec<&str> = p.lines().collect();
            let literal = lines.iter().all(indented)
                || (lines.len() > 1 && lines.iter().skip(1).all(indented));
            if literal {
                (
                    true,
                    lines
                        .iter()
                        .map(|l| l.strip_prefix("  ").unwrap_or(l))
                        .collect(),
                )
            } else {
                (false, lines.iter().map(|l| l.trim()).collect())
            }
        })
        .collect()
}

/// Fills `text` to `width` columns, each line prefixed with `indent`.
fn fill(out: &mut String, text: &str, indent: usize, width: usize) {
    for (i, (literal, lines)) in paragraphs(text).into_iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if literal {
            for l in lines {
                let _ = writeln!(out, "{:indent$}  {l}", "");
            }
            continue;
        }
        let mut col = 0;
        for w in lines.iter().flat_map(|l| l.split_whitespace()) {
            let n = w.chars().count();
            if col > 0 && col + 1 + n > width.saturating_sub(indent) {
                out.push('\n');
                col = 0;
            }
            if col == 0 {
                let _ = write!(out, "{:indent$}{w}", "");
            } else {
                let _ = write!(out, " {w}");
                col += 1;
            }
            col += n;
        }
        if col > 0 {
            out.push('\n');
        }
    }
}

fn flag_rows(out: &mut String, flags: &[&Flag], indent: usize) {
    for f in flags {
        let name = f.display();
        let pad = FLAG_COL.saturating_sub(indent);
        if name.chars().count() + 2 <= pad {
            let mut body = String::new();
            fill(&mut body, f.help, FLAG_COL, WIDTH);
            let body = body.get(FLAG_COL..).unwrap_or("");
            let _ = write!(out, "{:indent$}{name:<pad$}{body}", "");
            if body.is_empty() {
                out.push('\n');
            }
        } else {
            let _ = writeln!(out, "{:indent$}{name}", "");
            fill(out, f.help, FLAG_COL, WIDTH);
        }
    }
}

pub(crate) fn help(spec: &Spec, command: Option<&Command>) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{} {}: {}\n", spec.name, spec.version, spec.about);
    s.push_str(&spec.usage(command));
    s.push('\n');
    match command {
        Some(c) => {
            fill(&mut s, c.about, 0, WIDTH);
            if !c.flags.is_empty() {
                s.push_str("\noptions:\n");
                flag_rows(&mut s, &c.flags.iter().collect::<Vec<_>>(), 2);
            }
            s.push_str("\nglobal options:\n");
            flag_rows(&mut s, &spec.global_flags().collect::<Vec<_>>(), 2);
        }
        None => {
            fill(&mut s, spec.description, 0, WIDTH);
            s.push_str("\noptions:\n");
            flag_rows(&mut s, &spec.global_flags().collect::<Vec<_>>(), 2);
            if !spec.commands.is_empty() {
                s.push_str("\ncommands:\n");
                for (i, c) in spec.commands.iter().enumerate() {
                    if i > 0 {
                        s.push('\n');
                    }
                    for l in spec.synopsis_lines(Some(c)).remove(0).lines() {
                        let _ = writeln!(s, "  {l}");
                    }
                    fill(&mut s, c.about, 6, WIDTH);
                    flag_rows(&mut s, &c.flags.iter().collect::<Vec<_>>(), 6);
                }
            }
        }
    }
    s
}

/// Escapes text for roff: backslashes, hyphens (as `\-`, so they copy and search as
/// ASCII), a leading control character, and a few typographic characters.
fn esc(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => s.push_str("\\e"),
            '-' => s.push_str("\\-"),
            '–' => s.push_str("\\(en"),
            '—' => s.push_str("\\(em"),
            '→' => s.push_str("\\(->"),
            '←' => s.push_str("\\(<-"),
            '×' => s.push_str("\\(mu"),
            '≥' => s.push_str("\\(>="),
            '≤' => s.push_str("\\(<="),
            '’' => s.push_str("\\(cq"),
            c => s.push(c),
        }
    }
    if s.starts_with('.') || s.starts_with('\'') {
        s.insert_str(0, "\\&");
    }
    s
}

fn man_text(out: &mut String, text: &str) {
    for (i, (literal, lines)) in paragraphs(text).into_iter().enumerate() {
        if i > 0 {
            out.push_str(".PP\n");
        }
        if literal {
            out.push_str(".RS 4\n.nf\n");
            for l in lines {
                let _ = writeln!(out, "{}", esc(l));
            }
            out.push_str(".fi\n.RE\n");
        } else {
            for l in lines {
                let _ = writeln!(out, "{}", esc(l));
            }
        }
    }
}

fn man_flag(out: &mut String, f: &Flag) {
    out.push_str(".TP\n");
    if let Some(c) = f.short {
        let _ = write!(out, "\\fB\\-{c}\\fR, ");
    }
    let _ = write!(out, "\\fB\\-\\-{}\\fR", esc(f.long));
    if let Some(v) = f.value {
        let _ = write!(out, " \\fI{}\\fR", esc(v));
    }
    out.push('\n');
    man_text(out, f.help);
}

/// A synopsis line: the binary and command in bold, the rest as written.
fn man_synopsis(out: &mut String, spec: &Spec, line: &str, command: &str) {
    let head = if command.is_empty() {
        spec.name.to_string()
    } else {
        format!("{} {command}", spec.name)
    };
    let rest = line.strip_prefix(head.as_str()).unwrap_or(line);
    let rest: Vec<String> = rest.split('\n').map(esc).collect();
    let _ = writeln!(out, "\\fB{}\\fR{}", esc(&head), rest.join("\n"));
}

pub(crate) fn man(spec: &Spec) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        ".\\\" Generated from the command-line table of {} (itcp-cli); do not edit.",
        spec.name
    );
    let _ = writeln!(
        s,
        ".TH \"{}\" \"1\" \"\" \"itcp {}\" \"I-TCP manual\"",
        spec.name.to_uppercase(),
        spec.version
    );
    s.push_str(".SH NAME\n");
    let _ = writeln!(s, "{} \\- {}", esc(spec.name), esc(spec.about));
    s.push_str(".SH SYNOPSIS\n.nf\n");
    if spec.synopsis.is_empty() {
        for c in spec.commands {
            let line = spec.synopsis_lines(Some(c)).remove(0);
            man_synopsis(&mut s, spec, &line, c.name);
        }
    } else {
        for line in spec.synopsis_lines(None) {
            man_synopsis(&mut s, spec, &line, "");
        }
    }
    s.push_str(".fi\n.SH DESCRIPTION\n");
    man_text(&mut s, spec.description);
    s.push_str(".SH OPTIONS\n");
    for f in spec.global_flags() {
        man_flag(&mut s, f);
    }
    if !spec.commands.is_empty() {
        s.push_str(".SH COMMANDS\n");
        for c in spec.commands {
            let _ = writeln!(s, ".SS \"{} {}\"", spec.name, c.name);
            s.push_str(".nf\n");
            let line = spec.synopsis_lines(Some(c)).remove(0);
            man_synopsis(&mut s, spec, &line, c.name);
            s.push_str(".fi\n.PP\n");
            man_text(&mut s, c.about);
            for f in c.flags {
                man_flag(&mut s, f);
            }
        }
    }
    for sec in spec.sections {
        let _ = writeln!(s, ".SH \"{}\"", sec.title);
        man_text(&mut s, sec.body);
    }
    s
}
