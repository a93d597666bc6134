//! msrd's modules form layers: no module imports, directly or through others, a
//! module that imports it. The test reads every `crate::`/`super::` path in
//! `proxy/src` (comments and `#[cfg(test)]` sections left out), maps each to the file
//! that defines it, and fails naming any cycle it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every .rs file under `dir`, as module paths relative to `src` ("daemon/routes").
fn modules(src: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            modules(src, &p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let rel = rel.to_string_lossy().into_owned();
            let rel = rel.strip_suffix("/mod").unwrap_or(&rel).to_string();
            if !rel.starts_with("bin/") && rel != "lib" {
                out.push(rel);
            }
        }
    }
}

/// The code of a file without comments and test sections.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line.split(" //").next().unwrap_or(""));
        out.push('\n');
    }
    out
}

/// The module a path names: the longest known prefix of its segments.
fn resolve(known: &BTreeSet<String>, segs: &[&str]) -> Option<String> {
    (1..=segs.len())
        .rev()
        .map(|n| segs[..n].join("/"))
        .find(|m| known.contains(m))
}

/// Paths after `crate::` or `super::` in `code` (braced groups expanded one level:
/// `crate::{a, b::c}`).
fn paths(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':' || c == '{'))
            .unwrap_or(rest.len());
        let head = &rest[..end];
        if let Some(b) = head.find('{') {
            let base: Vec<String> = head[..b]
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let close = rest[b..].find('}').map_or(rest.len(), |c| b + c);
            for item in rest[b + 1..close].split(',') {
                let mut p = base.clone();
                p.extend(
                    item.trim()
                        .split("::")
                        .map(|s| s.trim_matches(|c: char| !(c.is_alphanumeric() || c == '_')))
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
                out.push(p);
            }
        } else {
            out.push(
                head.split("::")
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect(),
            );
        }
    }
    out
}

fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut mods = Vec::new();
    modules(src, src, &mut mods);
    let known: BTreeSet<String> = mods.iter().cloned().collect();
    let mut g = BTreeMap::new();
    for m in &mods {
        let file = [format!("{m}.rs"), format!("{m}/mod.rs")]
            .into_iter()
            .map(|f| src.join(f))
            .find(|p: &PathBuf| p.exists())
            .unwrap();
        let is_mod_rs = file.ends_with("mod.rs");
        let text = code(&std::fs::read_to_string(&file).unwrap());
        // `super::` is the parent of this module (of its directory for a mod.rs).
        let parent: Vec<&str> = {
            let mut s: Vec<&str> = m.split('/').collect();
            s.pop();
            if is_mod_rs {
                s.pop();
            }
            s
        };
        let mut deps = BTreeSet::new();
        for (prefix, base) in [("crate::", vec![]), ("super::", parent.clone())] {
            for p in paths(&text, prefix) {
                let mut segs: Vec<&str> = base.clone();
                segs.extend(p.iter().map(String::as_str));
                if let Some(d) = resolve(&known, &segs) {
                    if &d != m && !m.starts_with(&format!("{d}/")) {
                        deps.insert(d);
                    }
                }
            }
        }
        g.insert(m.clone(), deps);
    }
    g
}

/// One cycle through `start`, if any (depth-first).
fn cycle_from(g: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn walk(
        g: &BTreeMap<String, BTreeSet<String>>,
        at: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for d in g.get(at).into_iter().flatten() {
            if d == start {
                path.push(d.clone());
                return true;
            }
            if seen.insert(d.clone()) {
                path.push(d.clone());
                if walk(g, d, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_string()];
    walk(g, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn msrd_modules_import_each_other_in_layers_only() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let g = graph(&src);
    assert!(g.len() > 20, "modules not found under {}", src.display());
    // The checker sees the imports it must see.
    assert!(
        g["handoff/greeting"].contains("daemon"),
        "{:?}",
        g["handoff/greeting"]
    );
    assert!(g["daemon"].contains("sessions"), "{:?}", g["daemon"]);
    let cycles: Vec<String> = g
        .keys()
        .filter_map(|m| cycle_from(&g, m))
        .map(|c| c.join(" → "))
        .collect();
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn a_cycle_is_found() {
    let mut g = BTreeMap::new();
    g.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    g.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    g.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    g.insert("d".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(cycle_from(&g, "a").unwrap(), ["a", "b", "c", "a"]);
    assert!(cycle_from(&g, "d").is_none());
    let p = paths(
        "use crate::{daemon::Daemon, sessions::{Frozen, Kind}};",
        "crate::",
    );
    assert_eq!(p[0], ["daemon", "Daemon"]);
    assert_eq!(p[1], ["sessions", "Frozen"]);
}
