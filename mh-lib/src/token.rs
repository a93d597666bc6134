//! The MH session token: 16 random bytes that every process of one MH presents to the
//! MSR (method `0x80`), so that the MSR can tell, at a handoff, that a greeting comes
//! from the MH owning the connections.
//!
//! Where it comes from (first match wins; see [`MhOptions::resolve_token`]):
//!
//! 1. an explicit token ([`MhOptions::token`]);
//! 2. an explicit token file ([`MhOptions::token_file`]);
//! 3. the environment variable `ITCP_TOKEN` (32 hex digits);
//! 4. the file named by `ITCP_TOKEN_FILE`, else `/run/itcp-mh/token`.
//!
//! A token file holds 32 hex digits (and optionally a newline). If it does not exist it
//! is created — directory included — with mode `0600`, filled from `/dev/urandom`.
//! Creation is atomic (written to a temporary file, then hard-linked into place), so
//! processes starting at the same time agree on one token.
//!
//! **Fallback:** if the file can neither be read nor created (typically: an unprivileged
//! process and no writable `/run/itcp-mh`), the process uses a random *per-process*
//! token instead, the same for all its connections. The MSR then sees each such process
//! as its own session. Give unprivileged processes `ITCP_TOKEN` or a readable
//! `ITCP_TOKEN_FILE` to avoid that. A file that exists but does not hold 32 hex digits is
//! an error (`InvalidData`), not a fallback.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::options::MhOptions;
use crate::socks::Token;

/// The session token this process presents, resolved from the environment and defaults
/// (`MhOptions::default().resolve_token()`).
pub fn token() -> io::Result<Token> {
    MhOptions::default().resolve_token()
}

/// Reads the token from `path`, creating the file (and its directory) with a fresh
/// random token and mode `0600` if it does not exist.
///
/// Errors: any I/O error reading or creating the file; `InvalidData` if the file exists
/// but does not hold 32 hex digits.
pub fn load_or_create_token_file(path: &Path) -> io::Result<Token> {
    match read_token_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => return other,
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| annotate(e, "creating directory", dir))?;
    }
    let token = random_token()?;
    let tmp = temp_path(path);
    let _ = fs::remove_file(&tmp); // a stale leftover of a dead process with our pid
    let result = write_new(&tmp, &token).and_then(|()| match fs::hard_link(&tmp, path) {
        Ok(()) => Ok(token),
        // Another process created it first: use theirs.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => read_token_file(path),
        Err(e) => Err(annotate(e, "creating", path)),
    });
    let _ = fs::remove_file(&tmp);
    result
}

/// [`load_or_create_token_file`], falling back to [`process_token`] when the file can
/// be neither read nor created (but not when it holds garbage).
pub(crate) fn token_from_file_or_process(path: &Path) -> io::Result<Token> {
    match load_or_create_token_file(path) {
        Ok(t) => Ok(t),
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(e),
        Err(_) => process_token(),
    }
}

/// `N` bytes from the kernel's CSPRNG (`/dev/urandom`).
fn urandom<const N: usize>() -> io::Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| io::Error::new(e.kind(), format!("reading /dev/urandom: {e}")))?;
    Ok(bytes)
}

/// A fresh random token.
pub fn random_token() -> io::Result<Token> {
    urandom().map(Token)
}

/// A fresh X25519 secret for one token exchange.
pub(crate) fn random_secret() -> io::Result<[u8; 32]> {
    urandom()
}

/// The random token of this process (drawn once, on first use), used when no shared
/// token is available.
pub fn process_token() -> io::Result<Token> {
    static TOKEN: OnceLock<Token> = OnceLock::new();
    if let Some(t) = TOKEN.get() {
        return Ok(*t);
    }
    let fresh = random_token()?;
    Ok(*TOKEN.get_or_init(|| fresh))
}

fn read_token_file(path: &Path) -> io::Result<Token> {
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|e| annotate(e, "reading", path))?;
    Token::from_hex(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "I-TCP token file {}: it must hold the MH's session token as 32 hex digits \
                 (16 bytes, e.g. 00112233445566778899aabbccddeeff), an optional newline and \
                 nothing else; it holds {} characters",
                path.display(),
                text.trim().len()
            ),
        )
    })
}

fn write_new(tmp: &Path, token: &Token) -> io::Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)
        .map_err(|e| annotate(e, "creating", tmp))?;
    // The umask can only clear bits of 0600, but make the mode exact anyway.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{}", token.to_hex()).map_err(|e| annotate(e, "writing", tmp))
}

fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "token".into());
    // Unique per process and call, so concurrent creators never share a temporary file.
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{seq}.tmp", std::process::id()))
}

fn annotate(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("I-TCP token file: {what} {}: {e}", path.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "itcp-mh-test-{tag}-{}-{:x}",
            std::process::id(),
            random_token().unwrap().0[0]
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn creates_file_with_mode_0600_and_reuses_it() {
        let dir = temp_dir("create");
        let path = dir.join("sub").join("token");
        let t1 = load_or_create_token_file(&path).unwrap();
        let meta = fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim(), t1.to_hex());
        assert_eq!(text.trim().len(), 32);
        let t2 = load_or_create_token_file(&path).unwrap();
        assert_eq!(t1, t2);
        // Through the options too.
        let t3 = MhOptions::new().token_file(&path).resolve_token().unwrap();
        assert_eq!(t1, t3);
        // No temporary files left behind.
        assert_eq!(fs::read_dir(dir.join("sub")).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn concurrent_creators_agree() {
        let dir = temp_dir("race");
        let path = dir.join("token");
        let tokens: Vec<Token> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create_token_file(&path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(tokens.iter().all(|t| *t == tokens[0]));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn garbage_file_is_an_error() {
        let dir = temp_dir("garbage");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        fs::write(&path, "not a token\n").unwrap();
        let e = load_or_create_token_file(&path).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("as 32 hex digits"), "{e}");
        let e = MhOptions::new()
            .token_file(&path)
            .resolve_token()
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unwritable_location_falls_back_to_process_token() {
        // A path below a regular file can be neither read nor created.
        let dir = temp_dir("fallback");
        fs::create_dir_all(&dir).unwrap();
        let blocker = dir.join("file");
        fs::write(&blocker, "x").unwrap();
        let path = blocker.join("token");
        assert!(load_or_create_token_file(&path).is_err());
        let t = MhOptions::new().token_file(&path).resolve_token().unwrap();
        assert_eq!(t, process_token().unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }
}
