use super::*;

static FLAGS: &[Flag] = &[
    Flag::value("port", "PORT", "The port."),
    Flag::switch("verbose", "Say more."),
    Flag::value("count", "N", "How many."),
];

static SPEC: Spec = Spec {
    name: "demo",
    version: "1.2.3",
    about: "a demonstration",
    synopsis: &["--port PORT [--verbose]"],
    description: "Does nothing - on a port.\n\n.leading dot\n\n  demo --port 80\n  demo --help",
    flags: FLAGS,
    commands: &[],
    sections: &[Section {
        title: "EXIT STATUS",
        body: "0 on success, 2 on a usage error.",
    }],
};

static CMDS: Spec = Spec {
    name: "lab",
    version: "1.2.3",
    about: "commands",
    synopsis: &[],
    description: "Has commands.",
    flags: &[],
    commands: &[
        Command {
            name: "up",
            synopsis: "[--msrs N]",
            about: "Up.",
            flags: &[Flag::value("msrs", "N", "MSRs.")],
        },
        Command {
            name: "bench paper",
            synopsis: "[--seeds N]",
            about: "Paper.",
            flags: &[Flag::value("seeds", "N", "Seeds.")],
        },
        Command {
            name: "bench relay",
            synopsis: "",
            about: "Relay.",
            flags: &[],
        },
    ],
    sections: &[],
};

fn args(spec: &'static Spec, a: &[&str]) -> Args {
    Args::new(spec, a.iter().map(|s| s.to_string()))
}

fn usage_msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Err(Stop::Usage(m, _)) => m,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

#[derive(Debug, Default)]
struct Demo {
    port: Option<u16>,
    verbose: bool,
    count: Option<u32>,
}

fn parse(mut a: Args) -> Result<Demo> {
    let mut d = Demo::default();
    while let Some(arg) = a.next()? {
        match arg {
            Arg::Flag("port") => d.port = Some(a.port("port")?),
            Arg::Flag("verbose") => d.verbose = true,
            Arg::Flag("count") => d.count = Some(a.int("count")?),
            other => return Err(a.unexpected(other)),
        }
    }
    Ok(d)
}

#[test]
fn flags_values_and_inline_values() {
    let d = parse(args(&SPEC, &["--port", "80", "--verbose", "--count=7"])).unwrap();
    assert_eq!((d.port, d.verbose, d.count), (Some(80), true, Some(7)));
    // A value may start with a dash.
    let mut a = args(&SPEC, &["--port", "-1"]);
    a.next().unwrap();
    assert_eq!(
        usage_msg(a.port("port")),
        "--port: -1 is not a port (1-65535)"
    );
}

#[test]
fn errors_name_the_flag() {
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["--frobnicate"]))),
        "unknown flag --frobnicate"
    );
    assert_eq!(usage_msg(parse(args(&SPEC, &["-x"]))), "unknown flag -x");
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["--port", "70000"]))),
        "--port: 70000 is not a port (1-65535)"
    );
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["--port"]))),
        "--port needs a value (PORT)"
    );
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["--verbose=yes"]))),
        "--verbose takes no value"
    );
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["--count", "5000000000"]))),
        "--count: 5000000000 is out of range (0-4294967295)"
    );
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["--count", "many"]))),
        "--count: \"many\" is not a whole number (0-4294967295)"
    );
    assert_eq!(
        usage_msg(parse(args(&SPEC, &["stray"]))),
        "unexpected argument 'stray'"
    );
    let text = usage_message(&SPEC, "unknown flag --frobnicate", None);
    assert_eq!(
        text,
        "demo: unknown flag --frobnicate\nusage: demo --port PORT [--verbose]\n(more: demo --help)\n"
    );
}

#[test]
fn help_version_and_man() {
    for h in ["-h", "--help"] {
        match parse(args(&SPEC, &["--port", "1", h])) {
            Err(Stop::Print(t)) => {
                assert!(t.starts_with("demo 1.2.3: a demonstration\n\nusage: demo --port"));
                assert!(t.contains("  --port PORT") && t.contains("-V, --version"));
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        parse(args(&SPEC, &["-V"])).unwrap_err(),
        Stop::Print("demo 1.2.3\n".into())
    );
    let Err(Stop::Print(man)) = parse(args(&SPEC, &["--man"])) else {
        panic!()
    };
    assert!(
        man.contains(".TH \"DEMO\" \"1\" \"\" \"itcp 1.2.3\""),
        "{man}"
    );
    assert!(
        man.contains(".SH NAME\ndemo \\- a demonstration\n"),
        "{man}"
    );
    assert!(
        man.contains("\\fB\\-\\-port\\fR \\fIPORT\\fR\nThe port.\n"),
        "{man}"
    );
    assert!(man.contains("Does nothing \\- on a port."), "{man}");
    assert!(man.contains("\\&.leading dot"), "{man}");
    assert!(man.contains(".nf\ndemo \\-\\-port 80\n"), "{man}");
    assert!(man.contains(".SH \"EXIT STATUS\"\n0 on success"), "{man}");
    // --help is not advertised as --man is not.
    assert!(!SPEC.help(None).contains("--man"));
}

#[test]
fn commands_of_one_and_two_words() {
    let mut a = args(&CMDS, &["bench", "paper", "--seeds", "3"]);
    assert_eq!(a.command().unwrap().name, "bench paper");
    assert_eq!(a.next().unwrap(), Some(Arg::Flag("seeds")));
    assert_eq!(a.int::<u64>("seeds").unwrap(), 3);
    // Flags of one command are unknown to another.
    let mut a = args(&CMDS, &["up", "--seeds", "3"]);
    a.command().unwrap();
    assert_eq!(usage_msg(a.next()), "unknown flag --seeds for 'lab up'");
    assert_eq!(
        usage_msg(args(&CMDS, &["bogus"]).command()),
        "unknown command 'bogus' (expected up, bench)"
    );
    assert_eq!(
        usage_msg(args(&CMDS, &["bench"]).command()),
        "bench: missing command (paper, relay)"
    );
    assert_eq!(
        usage_msg(args(&CMDS, &["bench", "x"]).command()),
        "unknown command 'x' after 'bench' (expected paper, relay)"
    );
    assert_eq!(
        usage_msg(args(&CMDS, &[]).command()),
        "missing command (up, bench)"
    );
    let mut a = args(&CMDS, &["bench", "paper", "--help"]);
    a.command().unwrap();
    let Err(Stop::Print(h)) = a.next() else {
        panic!()
    };
    assert!(h.contains("usage: lab bench paper [--seeds N]\n"), "{h}");
    assert!(!h.contains("--msrs"), "{h}");
    let Err(Stop::Print(h)) = args(&CMDS, &["help"]).command() else {
        panic!()
    };
    assert!(h.contains("lab bench relay"), "{h}");
    let man = CMDS.man();
    assert!(
        man.contains(".SS \"lab bench paper\"\n.nf\n\\fBlab bench paper\\fR [\\-\\-seeds N]\n"),
        "{man}"
    );
}

#[test]
fn check_table_finds_unhandled_flags() {
    check_table(&SPEC, parse);
    let forgot = |mut a: Args| -> Result<()> {
        while let Some(arg) = a.next()? {
            match arg {
                Arg::Flag("port") => {
                    a.port("port")?;
                }
                other => return Err(a.unexpected(other)),
            }
        }
        Ok(())
    };
    let r = std::panic::catch_unwind(|| check_table(&SPEC, forgot));
    assert!(r.is_err());
}

#[test]
fn help_wraps_long_descriptions() {
    static LONG: Spec = Spec {
        name: "x",
        version: "0",
        about: "y",
        synopsis: &[""],
        description: "word word word word word word word word word word word word word word word word word word word word",
        flags: &[Flag::value(
            "a-rather-long-flag-name",
            "VALUE",
            "help help help help help help help help help help help help help help help help",
        )],
        commands: &[],
        sections: &[],
    };
    let h = LONG.help(None);
    assert!(h.lines().all(|l| l.chars().count() <= 80), "{h}");
    assert!(
        h.contains("  --a-rather-long-flag-name VALUE\n                          help help"),
        "{h}"
    );
}
