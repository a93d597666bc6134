//! `itcp-cli`: the one command-line grammar of every I-TCP binary.
//!
//! Each binary describes itself once, in a [`Spec`]: its synopsis, description, flags
//! (name, value name, help) and subcommands. The same table
//!
//! * checks the command line ([`Args`]): a flag the table does not list is an error
//!   that names it, a flag that needs a value and has none is an error that names it;
//! * answers `-h`/`--help` ([`Spec::help`]) and `-V`/`--version`;
//! * renders the man page ([`Spec::man`], printed by the hidden `--man` flag).
//!
//! Usage errors print `NAME: MESSAGE` and the synopsis on stderr and exit with 2
//! ([`exit`]). Values are checked by the typed getters of [`Args`], whose messages
//! name the flag: `--beacon-port: 70000 is not a port (1-65535)`.
//!
//! ```no_run
//! use itcp_cli::{Arg, Args, Flag, Spec};
//! static SPEC: Spec = Spec {
//!     name: "demo",
//!     version: env!("CARGO_PKG_VERSION"),
//!     about: "a demonstration",
//!     synopsis: &["--port PORT [--verbose]"],
//!     description: "Does nothing, on a port.",
//!     flags: &[
//!         Flag::value("port", "PORT", "The port."),
//!         Flag::switch("verbose", "Say more."),
//!     ],
//!     commands: &[],
//!     sections: &[],
//! };
//! fn parse(mut a: Args) -> itcp_cli::Result<(u16, bool)> {
//!     let (mut port, mut verbose) = (None, false);
//!     while let Some(arg) = a.next()? {
//!         match arg {
//!             Arg::Flag("port") => port = Some(a.port("port")?),
//!             Arg::Flag("verbose") => verbose = true,
//!             other => return Err(a.unexpected(other)),
//!         }
//!     }
//!     Ok((port.ok_or_else(|| a.usage("--port is required"))?, verbose))
//! }
//! fn main() -> std::process::ExitCode {
//!     match parse(Args::from_env(&SPEC)) {
//!         Ok(_) => std::process::ExitCode::SUCCESS,
//!         Err(e) => itcp_cli::exit(&SPEC, e),
//!     }
//! }
//! ```

use std::ffi::OsString;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::str::FromStr;

mod render;
pub mod table;

/// One flag: `--long` (and optionally `-s`), a switch or a flag with one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flag {
    /// The name without the leading `--`.
    pub long: &'static str,
    /// A one-letter alias (`-x`), if any.
    pub short: Option<char>,
    /// The value's name in the synopsis (`FILE`); `None` for a switch.
    pub value: Option<&'static str>,
    /// One paragraph: what it does, its default.
    pub help: &'static str,
}

impl Flag {
    /// A flag without a value.
    pub const fn switch(long: &'static str, help: &'static str) -> Flag {
        Flag {
            long,
            short: None,
            value: None,
            help,
        }
    }

    /// A flag that takes one value (`--long VALUE` or `--long=VALUE`).
    pub const fn value(long: &'static str, value: &'static str, help: &'static str) -> Flag {
        Flag {
            long,
            short: None,
            value: Some(value),
            help,
        }
    }

    /// `--long VALUE`, as in help texts.
    pub fn display(&self) -> String {
        let mut s = String::new();
        if let Some(c) = self.short {
            let _ = write!(s, "-{c}, ");
        }
        let _ = write!(s, "--{}", self.long);
        if let Some(v) = self.value {
            let _ = write!(s, " {v}");
        }
        s
    }
}

/// `-h`, `--help`: every binary has it.
pub const HELP: Flag = Flag {
    long: "help",
    short: Some('h'),
    value: None,
    help: "Print the help and exit.",
};

/// `-V`, `--version`: every binary has it.
pub const VERSION: Flag = Flag {
    long: "version",
    short: Some('V'),
    value: None,
    help: "Print the version and exit.",
};

/// A subcommand (`send`, or two words: `bench paper`) and its own flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    /// One or more words: `"send"`, `"bench paper"`.
    pub name: &'static str,
    /// What follows the name in the synopsis: `"--listen ADDR:PORT [--once]"`.
    pub synopsis: &'static str,
    /// What it does (paragraphs separated by blank lines).
    pub about: &'static str,
    /// Flags of this command (the binary's global flags are accepted too).
    pub flags: &'static [Flag],
}

/// A further man page section: `EXIT STATUS`, `FILES`, `ENVIRONMENT`, `EXAMPLES`, ...
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    /// The title, upper case by convention.
    pub title: &'static str,
    /// Paragraphs separated by blank lines; a paragraph whose lines all start with two
    /// spaces is shown as is (examples, tables).
    pub body: &'static str,
}

/// Everything a binary says about its command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// The binary's name.
    pub name: &'static str,
    /// `env!("CARGO_PKG_VERSION")`.
    pub version: &'static str,
    /// One line, lower case, no final period: the man page's NAME line.
    pub about: &'static str,
    /// Synopsis lines, each without the binary's name (a long one may continue on
    /// further lines, after `\n`). Empty for a binary with commands: the commands'
    /// synopses are used.
    pub synopsis: &'static [&'static str],
    /// Paragraphs separated by blank lines (see [`Section::body`]).
    pub description: &'static str,
    /// Flags accepted everywhere on the command line (`--help` and `--version` are
    /// added).
    pub flags: &'static [Flag],
    /// Subcommands, if any.
    pub commands: &'static [Command],
    /// Further man page sections.
    pub sections: &'static [Section],
}

impl Spec {
    /// The `--help` text of the binary, or of one of its commands.
    pub fn help(&self, command: Option<&Command>) -> String {
        render::help(self, command)
    }

    /// The man page, in roff (man(7) macros).
    pub fn man(&self) -> String {
        render::man(self)
    }

    /// `NAME VERSION`.
    pub fn version_line(&self) -> String {
        format!("{} {}\n", self.name, self.version)
    }

    /// The synopsis lines, `usage: ...` first.
    pub fn usage(&self, command: Option<&Command>) -> String {
        let lines = self.synopsis_lines(command);
        let mut s = String::new();
        for (i, l) in lines.iter().enumerate() {
            let lead = if i == 0 { "usage: " } else { "       " };
            let _ = writeln!(s, "{lead}{}", l.replace('\n', "\n       "));
        }
        s
    }

    /// Full synopsis lines (with the binary's name).
    pub fn synopsis_lines(&self, command: Option<&Command>) -> Vec<String> {
        // A long synopsis continues on further lines, indented to follow the name.
        let join = |head: String, rest: &str| {
            if rest.is_empty() {
                return head;
            }
            let cont = format!("\n{:1$}", "", head.chars().count() + 1);
            format!("{head} {}", rest.replace('\n', &cont))
        };
        match command {
            Some(c) => vec![join(format!("{} {}", self.name, c.name), c.synopsis)],
            None if !self.synopsis.is_empty() => self
                .synopsis
                .iter()
                .map(|l| join(self.name.to_string(), l))
                .collect(),
            None => self
                .commands
                .iter()
                .map(|c| join(format!("{} {}", self.name, c.name), c.synopsis))
                .collect(),
        }
    }

    /// The global flags, `--help` and `--version` included.
    pub fn global_flags(&self) -> impl Iterator<Item = &'static Flag> {
        self.flags.iter().chain([&HELP, &VERSION])
    }

    /// Every flag the table names (global and of every command).
    pub fn all_flags(&self) -> impl Iterator<Item = (Option<&'static Command>, &'static Flag)> {
        self.flags.iter().map(|f| (None, f)).chain(
            self.commands
                .iter()
                .flat_map(|c| c.flags.iter().map(move |f| (Some(c), f))),
        )
    }

    fn lookup_long(&self, cmd: Option<&'static Command>, name: &str) -> Option<&'static Flag> {
        self.global_flags()
            .chain(cmd.into_iter().flat_map(|c| c.flags.iter()))
            .find(|f| f.long == name)
    }

    fn lookup_short(&self, cmd: Option<&'static Command>, c: char) -> Option<&'static Flag> {
        self.global_flags()
            .chain(cmd.into_iter().flat_map(|c| c.flags.iter()))
            .find(|f| f.short == Some(c))
    }
}

/// Why parsing stopped before the program ran: see [`exit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// A usage error: the message (without the program's name) and the command it
    /// concerns, for the synopsis. Exit status 2.
    Usage(String, Option<&'static Command>),
    /// `--help`, `--version` or `--man`: the text for stdout. Exit status 0.
    Print(String),
}

/// What parsing functions return.
pub type Result<T> = std::result::Result<T, Stop>;

/// Prints what `stop` says (usage errors with the synopsis on stderr) and returns the
/// exit status: 0 for `--help`/`--version`, 2 for usage errors.
pub fn exit(spec: &Spec, stop: Stop) -> ExitCode {
    match stop {
        Stop::Print(text) => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            // A closed pipe (`msrd --help | head -1`) is not an error worth reporting.
            let _ = out.write_all(text.as_bytes());
            let _ = out.flush();
            ExitCode::SUCCESS
        }
        Stop::Usage(msg, cmd) => {
            eprint!("{}", usage_message(spec, &msg, cmd));
            ExitCode::from(2)
        }
    }
}

/// The text [`exit`] prints on stderr for a usage error.
pub fn usage_message(spec: &Spec, msg: &str, cmd: Option<&Command>) -> String {
    let help = match cmd {
        Some(c) => format!("{} {} --help", spec.name, c.name),
        None => format!("{} --help", spec.name),
    };
    format!("{}: {msg}\n{}(more: {help})\n", spec.name, spec.usage(cmd))
}

/// One element of the command line, as [`Args::next`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// A flag the table lists, by its long name (`"beacon-port"`). Its value, if it
    /// takes one, is read with [`Args::value`] or a typed getter.
    Flag(&'static str),
    /// A word that is not a flag (a command name, a positional argument).
    Word(String),
}

/// The command line of a binary, checked against its [`Spec`].
pub struct Args {
    spec: &'static Spec,
    p: lexopt::Parser,
    cmd: Option<&'static Command>,
    /// The flag read last, for messages about its value.
    flag: Option<&'static Flag>,
}

impl Args {
    /// The process's arguments.
    pub fn from_env(spec: &'static Spec) -> Args {
        Args::new(spec, std::env::args_os().skip(1))
    }

    /// The given arguments (without the program name).
    pub fn new<I, S>(spec: &'static Spec, args: I) -> Args
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Args {
            spec,
            p: lexopt::Parser::from_args(args),
            cmd: None,
            flag: None,
        }
    }

    /// The command chosen so far ([`Args::command`], [`Args::set_command`]).
    pub fn current_command(&self) -> Option<&'static Command> {
        self.cmd
    }

    /// From now on, accept the flags of command `name` (a name in the table).
    pub fn set_command(&mut self, name: &str) -> &'static Command {
        let c = self
            .spec
            .commands
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("{}: no command {name:?} in the table", self.spec.name));
        self.cmd = Some(c);
        c
    }

    /// Reads the command words (one or two, as the table's names have) and selects the
    /// command. Global flags may come first; `help` is taken as `--help`.
    pub fn command(&mut self) -> Result<&'static Command> {
        let expected = |prefix: &str| -> String {
            let mut names: Vec<&str> = self
                .spec
                .commands
                .iter()
                .filter_map(|c| {
                    let rest = if prefix.is_empty() {
                        Some(c.name)
                    } else {
                        c.name.strip_prefix(prefix)?.strip_prefix(' ')
                    };
                    rest.map(|r| r.split(' ').next().unwrap_or(r))
                })
                .collect();
            names.dedup();
            names.join(", ")
        };
        let mut words: Vec<String> = Vec::new();
        loop {
            let so_far = words.join(" ");
            let arg = self.next()?;
            let word = match arg {
                Some(Arg::Word(w)) if w == "help" && words.is_empty() => {
                    return Err(Stop::Print(self.spec.help(None)))
                }
                Some(Arg::Word(w)) => w,
                Some(Arg::Flag(f)) => {
                    return Err(self.usage(format!(
                        "--{f} must come after the command{}",
                        if so_far.is_empty() {
                            String::new()
                        } else {
                            format!(" ({so_far} ...)")
                        }
                    )))
                }
                None if so_far.is_empty() => {
                    return Err(self.usage(format!("missing command ({})", expected(""))))
                }
                None => {
                    return Err(
                        self.usage(format!("{so_far}: missing command ({})", expected(&so_far)))
                    )
                }
            };
            words.push(word);
            let name = words.join(" ");
            if let Some(c) = self.spec.commands.iter().find(|c| c.name == name) {
                self.cmd = Some(c);
                return Ok(c);
            }
            let prefix = format!("{name} ");
            if !self
                .spec
                .commands
                .iter()
                .any(|c| c.name.starts_with(&prefix))
            {
                let known = expected(&so_far);
                return Err(self.usage(if so_far.is_empty() {
                    format!("unknown command '{name}' (expected {known})")
                } else {
                    format!(
                        "unknown command '{}' after '{so_far}' (expected {known})",
                        words.last().unwrap()
                    )
                }));
            }
        }
    }

    /// The next flag or word. `--help`, `--version` and `--man` stop parsing with the
    /// text to print; a flag that the table does not list (globally or for the chosen
    /// command) is a usage error naming it.
    // Named as lexopt's: not an Iterator, as it stops with a Result.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Arg>> {
        let arg = match self.p.next() {
            Ok(Some(a)) => a,
            Ok(None) => return Ok(None),
            Err(e) => return Err(self.lexopt_error(e)),
        };
        let flag = match arg {
            lexopt::Arg::Long("man") => return Err(Stop::Print(self.spec.man())),
            lexopt::Arg::Long(name) => match self.spec.lookup_long(self.cmd, name) {
                Some(f) => f,
                None => {
                    let shown = format!("--{name}");
                    return Err(self.unknown_flag(&shown));
                }
            },
            lexopt::Arg::Short(c) => match self.spec.lookup_short(self.cmd, c) {
                Some(f) => f,
                None => return Err(self.unknown_flag(&format!("-{c}"))),
            },
            lexopt::Arg::Value(v) => {
                return match v.into_string() {
                    Ok(s) => Ok(Some(Arg::Word(s))),
                    Err(v) => Err(self.usage(format!("{v:?} is not valid UTF-8"))),
                }
            }
        };
        self.flag = Some(flag);
        if *flag == HELP {
            return Err(Stop::Print(self.spec.help(self.cmd)));
        }
        if *flag == VERSION {
            return Err(Stop::Print(self.spec.version_line()));
        }
        Ok(Some(Arg::Flag(flag.long)))
    }

    /// The remaining words, when only positional arguments are left (`--` ends flags).
    pub fn words(&mut self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        while let Some(a) = self.next()? {
            match a {
                Arg::Word(w) => out.push(w),
                other => return Err(self.unexpected(other)),
            }
        }
        Ok(out)
    }

    /// The value of flag `long` (just returned by [`Args::next`]).
    pub fn value(&mut self, long: &str) -> Result<String> {
        match self.p.value() {
            Ok(v) => v
                .into_string()
                .map_err(|v| self.usage(format!("--{long}: {v:?} is not valid UTF-8"))),
            Err(_) => {
                let what = self
                    .flag
                    .filter(|f| f.long == long)
                    .and_then(|f| f.value)
                    .unwrap_or("a value");
                Err(self.usage(format!("--{long} needs a value ({what})")))
            }
        }
    }

    /// The value of `long` parsed as `T`; a value that does not parse is a usage error
    /// `--long: VALUE is not WHAT`.
    pub fn parse<T: FromStr>(&mut self, long: &str, what: &str) -> Result<T> {
        let v = self.value(long)?;
        v.parse()
            .map_err(|_| self.usage(format!("--{long}: {v:?} is not {what}")))
    }

    /// A whole number that fits `T` (`--count: -1 is not a whole number (0-65535)`).
    pub fn int<T: Int>(&mut self, long: &str) -> Result<T> {
        self.int_in(long, T::MIN_I128, T::MAX_I128)
    }

    /// A whole number in `lo..=hi` (which must fit `T`).
    pub fn int_in<T: Int>(&mut self, long: &str, lo: i128, hi: i128) -> Result<T> {
        let v = self.value(long)?;
        // Bounds past 2^32 are not worth spelling out.
        let range = if hi < 1 << 32 {
            format!("{lo}-{hi}")
        } else {
            format!("at least {lo}")
        };
        match v.trim().parse::<i128>() {
            Ok(n) if n >= lo && n <= hi => Ok(T::from_i128(n)),
            Ok(_) => Err(self.usage(format!("--{long}: {v} is out of range ({range})"))),
            Err(_) => Err(self.usage(format!("--{long}: {v:?} is not a whole number ({range})"))),
        }
    }

    /// A TCP or UDP port, 1-65535.
    pub fn port(&mut self, long: &str) -> Result<u16> {
        let v = self.value(long)?;
        match v.trim().parse::<u64>() {
            Ok(n @ 1..=65535) => Ok(n as u16),
            _ => Err(self.usage(format!("--{long}: {v} is not a port (1-65535)"))),
        }
    }

    /// A finite number greater than zero.
    pub fn positive_f64(&mut self, long: &str) -> Result<f64> {
        let v = self.value(long)?;
        match v.trim().parse::<f64>() {
            Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
            _ => Err(self.usage(format!("--{long}: {v:?} is not a number greater than 0"))),
        }
    }

    /// One of `choices` (`--policy: "fast" is not one of eager, lazy`).
    pub fn choice(&mut self, long: &str, choices: &[&'static str]) -> Result<&'static str> {
        let v = self.value(long)?;
        choices.iter().find(|c| **c == v).copied().ok_or_else(|| {
            self.usage(format!(
                "--{long}: {v:?} is not one of {}",
                choices.join(", ")
            ))
        })
    }

    /// A usage error with this message (for the current command's synopsis).
    pub fn usage(&self, msg: impl Into<String>) -> Stop {
        Stop::Usage(msg.into(), self.cmd)
    }

    /// The usage error for an argument the caller did not expect here.
    pub fn unexpected(&self, arg: Arg) -> Stop {
        match arg {
            // A flag of the table that the caller's match forgot: a bug in the binary,
            // which the binaries' tests catch by trying every flag of the table.
            Arg::Flag(f) => panic!(
                "{}: --{f} is in the flag table but not handled",
                self.spec.name
            ),
            Arg::Word(w) => self.usage(match self.cmd {
                Some(c) => format!(
                    "unexpected argument '{w}' for '{} {}'",
                    self.spec.name, c.name
                ),
                None => format!("unexpected argument '{w}'"),
            }),
        }
    }

    fn unknown_flag(&self, shown: &str) -> Stop {
        let owners: Vec<&str> = self
            .spec
            .commands
            .iter()
            .filter(|c| c.flags.iter().any(|f| shown == format!("--{}", f.long)))
            .map(|c| c.name)
            .collect();
        self.usage(match self.cmd {
            Some(c) => format!("unknown flag {shown} for '{} {}'", self.spec.name, c.name),
            None if !owners.is_empty() => format!(
                "{shown} is an option of {}: give it after the command",
                owners.join(", ")
            ),
            None => format!("unknown flag {shown}"),
        })
    }

    fn lexopt_error(&self, e: lexopt::Error) -> Stop {
        self.usage(match e {
            lexopt::Error::UnexpectedValue { option, .. } => format!("{option} takes no value"),
            lexopt::Error::MissingValue {
                option: Some(option),
            } => format!("{option} needs a value"),
            other => other.to_string(),
        })
    }
}

/// Integer types [`Args::int`] reads.
pub trait Int: Copy {
    /// The smallest value.
    const MIN_I128: i128;
    /// The largest value.
    const MAX_I128: i128;
    /// Conversion of a value in range.
    fn from_i128(n: i128) -> Self;
}

macro_rules! int {
    ($($t:ty),*) => {$(
        impl Int for $t {
            const MIN_I128: i128 = <$t>::MIN as i128;
            const MAX_I128: i128 = <$t>::MAX as i128;
            fn from_i128(n: i128) -> Self {
                n as $t
            }
        }
    )*};
}
int!(u8, u16, u32, u64, usize, i32, i64);

#[cfg(test)]
mod tests;

/// Tries every flag of `spec`'s table on `parse` (with each command selected, and a
/// harmless value): each must be handled (`parse` must not panic) and none may be
/// reported unknown. For the binaries' own tests.
pub fn check_table<T>(spec: &'static Spec, parse: impl Fn(Args) -> Result<T>) {
    for (cmd, f) in spec.all_flags() {
        let mut argv: Vec<String> = Vec::new();
        if let Some(c) = cmd {
            argv.extend(c.name.split(' ').map(String::from));
        }
        argv.push(format!("--{}", f.long));
        if f.value.is_some() {
            argv.push("1".into());
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            parse(Args::new(spec, argv.clone()))
        }));
        match r {
            Err(_) => panic!("{}: {argv:?} panicked: the flag is not handled", spec.name),
            Ok(Err(Stop::Usage(m, _))) if m.contains("unknown flag") => {
                panic!("{}: {argv:?}: {m}", spec.name)
            }
            Ok(_) => {}
        }
    }
    // The man page and the help render (and name every flag).
    let man = spec.man();
    let help = spec.help(None);
    for (_, f) in spec.all_flags() {
        let roff = format!("\\-\\-{}", f.long.replace('-', "\\-"));
        assert!(
            man.contains(&roff),
            "{}: man page lacks --{}",
            spec.name,
            f.long
        );
        assert!(
            help.contains(&format!("--{}", f.long)),
            "{}: help lacks --{}",
            spec.name,
            f.long
        );
    }
}
