//! The documentation: the README stays a newcomer's guide (at most 200 lines, the two
//! quick-start commands CI and newcomers run, a configuration msrd accepts), every
//! relative link in README.md and docs/*.md resolves to a file inside the repository,
//! and the man pages in docs/man render their FILES and EXAMPLES sections as section
//! headings followed by one line per entry (groff, from Debian's groff-base, which
//! scripts/setup.sh installs).

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("the repository root")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// README.md and every docs/*.md.
fn markdown_files() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The text outside fenced code blocks, with inline code spans blanked out, line by
/// line (so that code such as `a[i](x)` is not taken for a link).
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut kept = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push((i + 1, kept));
    }
    out
}

/// The targets of a line's inline links and images (`[text](target)`,
/// `![alt](target)`) and of a reference definition (`[label]: target`).
fn link_targets(line: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let Some(end) = after.find(')') else { break };
        let target = after[..end].split_whitespace().next().unwrap_or("");
        targets.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &after[end..];
    }
    let t = line.trim_start();
    if t.starts_with('[') {
        if let Some(at) = t.find("]:") {
            if let Some(target) = t[at + 2..].split_whitespace().next() {
                targets.push(target.to_string());
            }
        }
    }
    targets
}

fn is_external(target: &str) -> bool {
    let t = target.to_ascii_lowercase();
    t.starts_with("http://") || t.starts_with("https://") || t.starts_with("mailto:")
}

#[test]
fn every_relative_link_resolves_inside_the_repository() {
    let root = root();
    let mut bad = Vec::new();
    let mut checked = 0;
    for file in markdown_files() {
        let dir = file.parent().unwrap().to_path_buf();
        let name = file.strip_prefix(&root).unwrap().display().to_string();
        for (n, line) in prose_lines(&read(&file)) {
            for target in link_targets(&line) {
                if is_external(&target) {
                    continue;
                }
                let path = target.split('#').next().unwrap_or("");
                if path.is_empty() {
                    continue; // an anchor in the same file
                }
                checked += 1;
                if path.starts_with('/') {
                    bad.push(format!("{name}:{n}: {target}: an absolute path"));
                    continue;
                }
                match dir.join(path).canonicalize() {
                    Err(e) => bad.push(format!("{name}:{n}: {target}: {e}")),
                    Ok(p) if !p.starts_with(&root) => {
                        bad.push(format!("{name}:{n}: {target}: outside the repository"))
                    }
                    Ok(_) => {}
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} relative links found: is the parser broken?"
    );
    assert!(
        bad.is_empty(),
        "links that do not resolve:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_link_parser_finds_links_and_skips_code() {
    assert_eq!(
        link_targets("see [a](docs/a.md#x) and ![b](<b.svg> \"t\") [c](https://x)"),
        ["docs/a.md#x", "b.svg", "https://x"]
    );
    assert_eq!(link_targets("[ref]: ../LICENSE-MIT"), ["../LICENSE-MIT"]);
    let lines = prose_lines("a `v[i](x)` [d](d.md)\n```\n[e](e.md)\n```\n");
    let targets: Vec<String> = lines.iter().flat_map(|(_, l)| link_targets(l)).collect();
    assert_eq!(targets, ["d.md"]);
}

#[test]
fn readme_is_short_and_has_the_quick_start_commands() {
    let text = read(&root().join("README.md"));
    let lines = text.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines; the limit is 200 (move detail to docs/)"
    );
    // CI and newcomers run these exact commands.
    for cmd in ["./scripts/demo", "./scripts/test"] {
        assert!(
            text.lines().any(|l| l == cmd),
            "README.md has no line that is exactly {cmd}"
        );
    }
    assert!(
        text.contains("## Quick start"),
        "README.md: no Quick start heading"
    );
}

/// The fenced blocks of a language in a Markdown text.
fn fenced_blocks(text: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let t = line.trim_start();
        if let Some(info) = t.strip_prefix("```") {
            match current.take() {
                Some(block) => blocks.push(block),
                None if info.trim() == lang => current = Some(String::new()),
                None => current = Some(String::from("\u{0}")), // another language
            }
            continue;
        }
        if let Some(b) = current.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
    }
    blocks.retain(|b| !b.starts_with('\u{0}'));
    blocks
}

#[test]
fn the_readmes_configuration_is_one_msrd_accepts() {
    let text = read(&root().join("README.md"));
    let configs: Vec<String> = fenced_blocks(&text, "toml")
        .into_iter()
        .filter(|b| b.contains("[msr]"))
        .collect();
    assert!(!configs.is_empty(), "README.md shows no msrd configuration");
    for c in configs {
        if let Err(e) = itcp_config::MsrdConfig::from_str(&c, "README.md") {
            panic!("README.md's configuration does not load: {e}\n{c}");
        }
    }
}

/// The text lines of a man page section (`.SH "TITLE"` up to the next `.SH`), with
/// the few escapes the generator writes undone; `None` for a line with other escapes.
fn man_section_lines(roff: &str, title: &str) -> Vec<Option<String>> {
    let head = format!(".SH \"{title}\"");
    let mut lines = Vec::new();
    let mut inside = false;
    for l in roff.lines() {
        if l.starts_with(".SH") {
            inside = l == head;
            continue;
        }
        if !inside || l.starts_with('.') || l.trim().is_empty() {
            continue;
        }
        let text = l
            .replace("\\-", "-")
            .replace("\\e", "\\")
            .replace("\\&", "");
        lines.push((!text.contains('\\')).then_some(text));
    }
    lines
}

fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn man_pages_render_files_and_examples_one_entry_per_line() {
    let expected: &[(&str, &[&str])] = &[
        ("msrd", &["FILES", "EXAMPLES"]),
        ("itcpctl", &["FILES", "EXAMPLES"]),
        ("itcp-mh-agent", &["FILES", "EXAMPLES"]),
        ("itcp-lab", &["EXAMPLES"]),
        ("ttcp", &["EXAMPLES"]),
    ];
    let dir = root().join("docs/man");
    for (page, sections) in expected {
        let file = dir.join(format!("{page}.1"));
        let roff = read(&file);
        let out = Command::new("groff")
            .args(["-man", "-Tascii", "-P-c", "-P-b", "-P-o", "-P-u", "-ww"])
            .arg(&file)
            .output()
            .unwrap_or_else(|e| {
                panic!("groff: {e} (install groff-base and man-db: scripts/setup.sh does)")
            });
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && out.stderr.is_empty(),
            "{page}.1: groff: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered: Vec<&str> = text.lines().collect();
        for title in *sections {
            // A section heading is a line of its own at the left margin.
            let at = rendered
                .iter()
                .position(|l| l == title)
                .unwrap_or_else(|| panic!("{page}(1): no {title} heading line in:\n{text}"));
            let body: Vec<String> = rendered[at + 1..]
                .iter()
                .take_while(|l| l.is_empty() || l.starts_with(' '))
                .map(|l| words(l))
                .collect();
            let want = man_section_lines(&roff, title);
            assert!(!want.is_empty(), "{page}.1: an empty {title} section");
            // Each entry of the source is a rendered line of its own: none is filled
            // into a paragraph with the next.
            for line in want.into_iter().flatten() {
                assert!(
                    body.contains(&words(&line)),
                    "{page}(1) {title}: {line:?} is not a line of its own in:\n{}",
                    body.join("\n")
                );
            }
        }
    }
}
