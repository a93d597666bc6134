//! Which answers to its greetings the agent acts on, decided without I/O.
//!
//! An answer points the MH's gateway at an MSR, so a forged one could hand the MH's
//! traffic to any station on the cell. An MSR that holds the MH's session token tags
//! its answers under it (`GreetReply::seal`); every MSR that moves the MH's connections
//! holds it (the old MSR checks the greeting's proof with it and ships it on the
//! encrypted channel). So, once attached:
//!
//! * a tagged answer acts if the tag verifies, and is dropped otherwise;
//! * an untagged `holding` or `moved` is dropped: no MSR sends one;
//! * an untagged `attached`, `failed` or `refused` is kept aside. It is what an MSR
//!   sends that cannot know the token (the previous MSR crashed with it, or never had
//!   it), and it acts only if no tagged answer came within a second, no tagged
//!   `holding` came at all, the previous MSR has gone silent (no beacon within its
//!   lifetime) and the one that answered is still heard; the MH's link going down
//!   discards it (it came from a cell the MH left, and leaving silences the previous
//!   MSR): a station next to a live MSR cannot use it, nor one racing a genuine MSR's
//!   answer, nor one whose cell the MH leaves.
//!
//! Before the first attachment nothing is tagged (no MSR knows the token yet): the
//! first contact trusts the cell, as any host trusts its first gateway.
//!
//! A refusal or failure of a greeting that went out more than once is not judged at
//! first: the agent greets afresh ([`greet_afresh`]).

use std::net::IpAddr;

use itcp_proto::greeting::{GreetReply, GreetStatus};

/// What to do with one answer to the pending greeting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Act on it now.
    Act,
    /// Keep it: act on it if nothing better comes and the previous MSR is silent.
    Fallback,
    /// Drop it (the reason, for the log).
    Drop(&'static str),
}

/// Judges answer `r` under the MH's `token`; `attached`: the MH attached before.
pub fn judge(r: &GreetReply, token: &[u8], attached: bool) -> Verdict {
    if r.tag.is_some() {
        return if r.verify(token) {
            Verdict::Act
        } else {
            Verdict::Drop("tag does not verify under the MH's token")
        };
    }
    if !attached {
        return Verdict::Act;
    }
    match r.status {
        GreetStatus::Holding | GreetStatus::Moved => {
            Verdict::Drop("untagged: every MSR that moves connections tags its answers")
        }
        GreetStatus::Attached | GreetStatus::Failed | GreetStatus::Refused => Verdict::Fallback,
    }
}

/// What to do with an answer to the greeting for the MH's address of its other family
/// (a dual-stack MH greets once per address; the main greeting moves the gateway).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiblingVerdict {
    /// The MSR is at work (`holding`): keep the greeting going.
    Wait,
    /// Its final answer: stop greeting and report it.
    Final,
    /// Untagged `attached`, `failed` or `refused` once attached: keep greeting (a
    /// tagged answer may still come) and report it when the main move has ended, as
    /// the main greeting's own such answers wait for better ones.
    Fallback,
    /// Forged or untagged where a tag is due: keep greeting (the reason, for the log).
    Drop(&'static str),
}

/// Judges the answer `r` to a sibling greeting by the main greeting's rules
/// ([`judge`]): a station on the cell that read the greeting's nonce must not stop it
/// with a forged final answer, or the MH's connections of that family stay behind.
pub fn judge_sibling(r: &GreetReply, token: &[u8], attached: bool) -> SiblingVerdict {
    match judge(r, token, attached) {
        Verdict::Act if r.status == GreetStatus::Holding => SiblingVerdict::Wait,
        Verdict::Act => SiblingVerdict::Final,
        Verdict::Fallback => SiblingVerdict::Fallback,
        Verdict::Drop(why) => SiblingVerdict::Drop(why),
    }
}

/// Whether answer `r` to the greeting for the MH's other address vouches for its MSR:
/// tagged under the MH's token and saying that MSR holds the address's connections
/// (`moved`, `attached`). The main address may hold nothing at any MSR, so that none
/// can tag its answers (the token is bound under the other family's address): its
/// untagged `attached` from a vouched-for MSR is taken at once ([`judge_vouched`]).
pub fn vouches(r: &GreetReply, token: &[u8]) -> bool {
    r.tag.is_some()
        && r.verify(token)
        && matches!(r.status, GreetStatus::Moved | GreetStatus::Attached)
}

/// [`judge`] for the main greeting's answer `r` when its MSR was `vouched` for
/// ([`vouches`]): an untagged `attached` acts; nothing else changes.
pub fn judge_vouched(r: &GreetReply, token: &[u8], attached: bool, vouched: bool) -> Verdict {
    match judge(r, token, attached) {
        Verdict::Fallback if vouched && r.status == GreetStatus::Attached => Verdict::Act,
        v => v,
    }
}

/// Whether to greet afresh (a new timestamp and nonce, the same MSRs) instead of
/// judging answer `r` (a refusal or a failure) to a greeting sent `sends` times,
/// `refreshed` before or not.
///
/// The old MSR takes each greeting once. When the handoff it started rolled back (the
/// new MSR died mid-way and started again, say), a retransmission of that greeting is
/// a replay to it and is refused (the new MSR answers "failed"), though the MH never
/// moved: a fresh greeting asks the same with a new proof. Once per greeting: the next
/// such answer is judged as usual. A forged one gains its sender one more greeting
/// from the MH.
pub fn greet_afresh(r: &GreetReply, sends: u32, refreshed: bool) -> bool {
    matches!(r.status, GreetStatus::Refused | GreetStatus::Failed) && sends > 1 && !refreshed
}

/// The MAC to point the gateway at for answer `r`: the one it names if it is tagged
/// (authenticated), else `beacon_mac` (what the MSR's beacon said).
pub fn gateway_mac(r: &GreetReply, beacon_mac: &str) -> String {
    match (&r.tag, &r.mac) {
        (Some(_), Some(m)) => m.clone(),
        _ => beacon_mac.to_string(),
    }
}

/// The gateway addresses (of `gateways`) that an answer for the MH's address
/// `answered` points at the answering MSR. A family's gateway follows only the move of
/// the MH's address of that family: until the new MSR holds that address, the old MSR
/// serves its connections, and a segment of one reaching the new MSR meets a kernel
/// that knows none of them (its SOCKS port answers with an RST). So an answer points
/// the gateways of its own family and, for the main greeting's (`main`), those of every
/// family none of whose addresses follows its own answer (`own_answer`: the MH's other
/// addresses still greeting, or already moved by their answer in this move — a main
/// move that fails must not take their gateway back from where their connections went).
pub fn gateways_to_point(
    gateways: &[IpAddr],
    answered: IpAddr,
    main: bool,
    own_answer: &[IpAddr],
) -> Vec<IpAddr> {
    let same = |a: &IpAddr, b: &IpAddr| a.is_ipv4() == b.is_ipv4();
    gateways
        .iter()
        .filter(|g| same(g, &answered) || (main && !own_answer.iter().any(|a| same(a, g))))
        .copied()
        .collect()
}

/// Where the MH's gateway goes when its move from one MSR to another failed (the new
/// MSR answered `failed`, or nobody answered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterFailure {
    /// Back to the previous MSR: its cell is still in range, and the connections
    /// stayed there.
    Back,
    /// To the new MSR: the MH is in its cell and no longer in the previous one's, so
    /// no other gateway can carry its packets. Connections left at the previous MSR
    /// can follow only by network detection; new ones work at once.
    Here,
    /// Neither MSR is heard: leave the gateway; the next beacon decides.
    Keep,
}

/// Decides [`AfterFailure`] from whether the previous and the new MSR are heard now
/// (a beacon within its lifetime). A gateway never points at an MSR whose cell the MH
/// has left while another MSR is in reach.
pub fn after_failure(previous_heard: bool, new_heard: bool) -> AfterFailure {
    match (previous_heard, new_heard) {
        (true, _) => AfterFailure::Back,
        (false, true) => AfterFailure::Here,
        (false, false) => AfterFailure::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_move_never_leaves_the_gateway_at_a_cell_the_mh_left() {
        assert_eq!(after_failure(true, true), AfterFailure::Back);
        assert_eq!(after_failure(true, false), AfterFailure::Back);
        assert_eq!(after_failure(false, true), AfterFailure::Here);
        assert_eq!(after_failure(false, false), AfterFailure::Keep);
    }

    /// A dual-stack cell's gateways and MH addresses, IPv4 first.
    fn dual_stack() -> ([IpAddr; 2], [IpAddr; 2]) {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        (
            [ip("10.2.0.1"), ip("2001:db8:2::1")],
            [ip("10.2.0.100"), ip("2001:db8:2::64")],
        )
    }

    #[test]
    fn each_family_s_gateway_follows_its_own_address_s_answer() {
        let ([g4, g6], [mh4, mh6]) = dual_stack();
        let gws = [g4, g6];
        // The main (IPv4) answer while the IPv6 address still greets: IPv4 only.
        assert_eq!(gateways_to_point(&gws, mh4, true, &[mh6]), vec![g4]);
        // Once the IPv6 greeting has ended: both.
        assert_eq!(gateways_to_point(&gws, mh4, true, &[]), vec![g4, g6]);
        // The IPv6 address's own answer: IPv6 only, whoever else still greets.
        assert_eq!(gateways_to_point(&gws, mh6, false, &[]), vec![g6]);
        assert_eq!(gateways_to_point(&gws, mh6, false, &[mh6]), vec![g6]);
        // A single-stack MH: its one gateway.
        assert_eq!(gateways_to_point(&[g4], mh4, true, &[]), vec![g4]);
    }

    #[test]
    fn a_failed_main_move_takes_back_no_family_its_sibling_moved() {
        let ([g4, g6], [mh4, mh6]) = dual_stack();
        // The IPv6 address moved by its own answer; the main move then failed and the
        // gateway goes back: IPv4's only, IPv6's stays with the connections it moved.
        assert_eq!(gateways_to_point(&[g4, g6], mh4, true, &[mh6]), vec![g4]);
        // Its sibling failed too: both go back.
        assert_eq!(gateways_to_point(&[g4, g6], mh4, true, &[]), vec![g4, g6]);
    }

    const TOKEN: &[u8] = b"0123456789abcdef";

    fn reply(status: GreetStatus) -> GreetReply {
        GreetReply {
            msr: "msr2".into(),
            nonce: "aa".into(),
            status,
            reason: None,
            connections: 1,
            mac: Some("02:00:00:00:02:01".into()),
            tag: None,
        }
    }

    #[test]
    fn a_siblings_greeting_ends_only_on_a_genuine_final_answer() {
        let sealed = |s: GreetStatus, key: &[u8]| {
            let mut r = reply(s);
            r.seal(key);
            r
        };
        // Tagged under the MH's token: holding waits, the rest ends the greeting.
        assert_eq!(
            judge_sibling(&sealed(GreetStatus::Holding, TOKEN), TOKEN, true),
            SiblingVerdict::Wait
        );
        for s in [
            GreetStatus::Moved,
            GreetStatus::Attached,
            GreetStatus::Failed,
            GreetStatus::Refused,
        ] {
            assert_eq!(
                judge_sibling(&sealed(s, TOKEN), TOKEN, true),
                SiblingVerdict::Final,
                "{s:?}"
            );
            // A station's forgery (another key) or an untagged answer once attached
            // does not end it.
            assert!(
                matches!(
                    judge_sibling(&sealed(s, b"not the token"), TOKEN, true),
                    SiblingVerdict::Drop(_)
                ),
                "{s:?}"
            );
            assert_ne!(
                judge_sibling(&reply(s), TOKEN, true),
                SiblingVerdict::Final,
                "{s:?}"
            );
        }
        assert_eq!(
            judge_sibling(&reply(GreetStatus::Refused), TOKEN, true),
            SiblingVerdict::Fallback
        );
        // First contact: nobody can tag yet.
        assert_eq!(
            judge_sibling(&reply(GreetStatus::Attached), TOKEN, false),
            SiblingVerdict::Final
        );
    }

    #[test]
    fn only_a_genuine_move_of_the_other_address_vouches_and_only_for_attached() {
        for s in [
            GreetStatus::Holding,
            GreetStatus::Moved,
            GreetStatus::Attached,
            GreetStatus::Failed,
            GreetStatus::Refused,
        ] {
            let holds = matches!(s, GreetStatus::Moved | GreetStatus::Attached);
            let mut r = reply(s);
            assert!(!vouches(&r, TOKEN), "untagged {s:?}");
            r.seal(b"a station's own token");
            assert!(!vouches(&r, TOKEN), "forged {s:?}");
            r.seal(TOKEN);
            assert_eq!(vouches(&r, TOKEN), holds, "{s:?}");
            // The main greeting's untagged answers from a vouched-for MSR: only
            // `attached` acts (a `failed` would send the gateway back; `holding` and
            // `moved` are tagged by any MSR that moves connections).
            let main = reply(s);
            let want = match s {
                GreetStatus::Attached => Verdict::Act,
                _ => judge(&main, TOKEN, true),
            };
            assert_eq!(judge_vouched(&main, TOKEN, true, true), want, "{s:?}");
            assert_eq!(
                judge_vouched(&main, TOKEN, true, false),
                judge(&main, TOKEN, true)
            );
        }
    }

    #[test]
    fn once_attached_only_tagged_answers_move_the_gateway_at_once() {
        for s in [
            GreetStatus::Holding,
            GreetStatus::Moved,
            GreetStatus::Attached,
            GreetStatus::Failed,
            GreetStatus::Refused,
        ] {
            let mut r = reply(s);
            // First contact: nobody can tag yet.
            assert_eq!(judge(&r, TOKEN, false), Verdict::Act);
            let untagged = judge(&r, TOKEN, true);
            assert_ne!(untagged, Verdict::Act, "{s:?}");
            r.seal(TOKEN);
            assert_eq!(judge(&r, TOKEN, true), Verdict::Act);
            assert_eq!(judge(&r, TOKEN, false), Verdict::Act);
            // A tag under another token is a forgery, before or after attaching.
            r.seal(b"fedcba9876543210");
            assert!(matches!(judge(&r, TOKEN, true), Verdict::Drop(_)));
            assert!(matches!(judge(&r, TOKEN, false), Verdict::Drop(_)));
        }
        assert!(matches!(
            judge(&reply(GreetStatus::Moved), TOKEN, true),
            Verdict::Drop(_)
        ));
        assert_eq!(
            judge(&reply(GreetStatus::Attached), TOKEN, true),
            Verdict::Fallback
        );
    }

    #[test]
    fn a_refused_retransmission_is_greeted_afresh_once() {
        for s in [GreetStatus::Refused, GreetStatus::Failed] {
            let r = reply(s);
            assert!(greet_afresh(&r, 2, false), "{s:?}");
            // The first transmission's answer is the MSR's answer to this very greeting.
            assert!(!greet_afresh(&r, 1, false), "{s:?}");
            // The same again after greeting afresh: believed.
            assert!(!greet_afresh(&r, 3, true), "{s:?}");
        }
        for s in [
            GreetStatus::Holding,
            GreetStatus::Moved,
            GreetStatus::Attached,
        ] {
            assert!(!greet_afresh(&reply(s), 5, false), "{s:?}");
        }
    }

    #[test]
    fn the_gateway_mac_comes_from_a_tagged_answer_only() {
        let mut r = reply(GreetStatus::Moved);
        assert_eq!(gateway_mac(&r, "02:66:66:66:66:66"), "02:66:66:66:66:66");
        r.seal(TOKEN);
        assert_eq!(gateway_mac(&r, "02:66:66:66:66:66"), "02:00:00:00:02:01");
        r.mac = None;
        r.seal(TOKEN);
        assert_eq!(gateway_mac(&r, "02:00:00:00:02:09"), "02:00:00:00:02:09");
    }
}
