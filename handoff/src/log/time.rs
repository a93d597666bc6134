//! Wall-clock times as operators write and read them: ISO 8601 in UTC
//! (`2025-03-01T14:05:09.123Z`) and "how long ago" (`90s`, `10m`, `2h`, `1d`, `1h30m`).
//! Times are µs since the UNIX epoch, as in the handoff records; no clock is read here
//! (the caller passes `now`).

/// What [`parse`] accepts, for error messages.
pub const FORMS: &str =
    "ISO 8601 like 2025-03-01T14:05:00Z or 2025-03-01, or how long ago: 90s, 10m, 2h, 1d";

const US_PER_S: u64 = 1_000_000;
const S_PER_DAY: i64 = 86_400;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = (if y >= 0 { y } else { y - 399 }) / 400;
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The date of a day counted from 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = (if z >= 0 { z } else { z - 146_096 }) / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// `2025-03-01T14:05:09.123Z`: UTC, millisecond precision (truncated).
pub fn format_utc_ms(us: u64) -> String {
    let secs = (us / US_PER_S) as i64;
    let (days, sod) = (secs.div_euclid(S_PER_DAY), secs.rem_euclid(S_PER_DAY));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        sod / 3600,
        sod / 60 % 60,
        sod % 60,
        us % US_PER_S / 1000
    )
}

/// A time as `--since`/`--until` take it, in µs since the epoch: ISO 8601 (`T` or a
/// space between date and time; seconds and fraction optional; `Z`, `+HH:MM`, `+HHMM`
/// or `+HH` offsets; no offset means UTC, the time `itcpctl handoffs` shows), a bare
/// date (midnight UTC), `now`, or how long before `now_us`: one or more
/// `NUMBER UNIT` with unit `s`, `m`, `h`, `d` or `w` (`90s`, `10m`, `1h30m`, `1.5h`),
/// optionally followed by ` ago`. The error says what is wrong, without the value.
pub fn parse(s: &str, now_us: u64) -> Result<u64, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("now") {
        return Ok(now_us);
    }
    if t.starts_with(|c: char| c.is_ascii_digit()) && t.len() > 4 && t.as_bytes()[4] == b'-' {
        return parse_iso(t);
    }
    let ago = parse_ago(t.strip_suffix(" ago").unwrap_or(t).trim())?;
    now_us
        .checked_sub(ago)
        .ok_or_else(|| "that is before 1970".into())
}

/// `90s`, `10m`, `1h30m`, `1.5h` as µs.
fn parse_ago(t: &str) -> Result<u64, String> {
    if t.is_empty() {
        return Err(format!("expected {FORMS}"));
    }
    let mut total = 0f64;
    let mut rest = t;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("a number without a unit (s, m, h, d or w); {FORMS}"))?;
        let (num, tail) = rest.split_at(n);
        let x: f64 = num.parse().map_err(|_| format!("expected {FORMS}"))?;
        let unit = tail.chars().next().unwrap_or(' ');
        let secs = match unit {
            's' => 1.0,
            'm' => 60.0,
            'h' => 3600.0,
            'd' => 86_400.0,
            'w' => 604_800.0,
            _ => return Err(format!("expected {FORMS}")),
        };
        total += x * secs;
        rest = &tail[1..];
    }
    let us = total * US_PER_S as f64;
    if !us.is_finite() || us > u64::MAX as f64 / 2.0 {
        return Err("too long ago".into());
    }
    Ok(us.round() as u64)
}

/// A fixed-width decimal field.
fn num(s: &str, what: &str, lo: u32, hi: u32) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if s.bytes().all(|b| b.is_ascii_digit()) && (lo..=hi).contains(&n) => Ok(n),
        _ => Err(format!("{what} {s:?} is not {lo}-{hi}")),
    }
}

fn parse_iso(t: &str) -> Result<u64, String> {
    let bad = || format!("expected {FORMS}");
    let (date, rest) = match t.find(['T', 't', ' ']) {
        Some(i) => (&t[..i], Some(&t[i + 1..])),
        None => (t, None),
    };
    let mut d = date.split('-');
    let (Some(ys), Some(ms), Some(ds), None) = (d.next(), d.next(), d.next(), d.next()) else {
        return Err(bad());
    };
    if ys.len() != 4 || ms.len() != 2 || ds.len() != 2 {
        return Err(bad());
    }
    let y = i64::from(num(ys, "year", 1970, 9999)?);
    let m = num(ms, "month", 1, 12)?;
    let day = num(ds, "day", 1, days_in_month(y, m))?;
    let mut secs = days_from_civil(y, m, day) * S_PER_DAY;
    let mut frac_us = 0u64;
    if let Some(rest) = rest {
        // The offset: Z, or a sign after the time of day.
        let (clock, offset) = if let Some(c) = rest.strip_suffix(['Z', 'z']) {
            (c, 0)
        } else if let Some(i) = rest.find(['+', '-']) {
            let (c, o) = rest.split_at(i);
            let sign = if o.starts_with('-') { -1 } else { 1 };
            let o = &o[1..];
            let (oh, om) = match (o.len(), o.split_once(':')) {
                (_, Some((h, m))) => (h, m),
                (4, None) => o.split_at(2),
                (2, None) => (o, "00"),
                _ => return Err(bad()),
            };
            if oh.len() != 2 || om.len() != 2 {
                return Err(bad());
            }
            let off = i64::from(num(oh, "offset hour", 0, 23)?) * 3600
                + i64::from(num(om, "offset minute", 0, 59)?) * 60;
            (c, sign * off)
        } else {
            (rest, 0)
        };
        let (hms, frac) = match clock.split_once(['.', ',']) {
            Some((a, f)) => (a, Some(f)),
            None => (clock, None),
        };
        let mut p = hms.split(':');
        let (Some(hs), Some(mins), ss, None) = (p.next(), p.next(), p.next(), p.next()) else {
            return Err(bad());
        };
        if hs.len() != 2 || mins.len() != 2 || ss.is_some_and(|s| s.len() != 2) {
            return Err(bad());
        }
        let h = num(hs, "hour", 0, 23)?;
        let mi = num(mins, "minute", 0, 59)?;
        let s = ss.map_or(Ok(0), |s| num(s, "second", 0, 59))?;
        if let Some(f) = frac {
            if ss.is_none() || f.is_empty() || f.len() > 9 || !f.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(bad());
            }
            let digits: String = f.chars().chain("000000".chars()).take(6).collect();
            frac_us = digits.parse().map_err(|_| bad())?;
        }
        secs += i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s) - offset;
    }
    if secs < 0 {
        return Err("that is before 1970".into());
    }
    Ok(secs as u64 * US_PER_S + frac_us)
}

#[cfg(test)]
mod tests {
    use super::*;

    // `date -u -d @1795405899.244241 +%FT%T.%3NZ` → 2026-11-23T03:51:39.244Z
    const T: u64 = 1_795_405_899_244_241;

    #[test]
    fn formats_utc_with_milliseconds() {
        assert_eq!(format_utc_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc_ms(T), "2026-11-23T03:51:39.244Z");
        // 951782400 = 2000-02-29T00:00:00Z (a leap day of a century leap year).
        assert_eq!(
            format_utc_ms(951_782_400 * US_PER_S + 999_999),
            "2000-02-29T00:00:00.999Z"
        );
        assert_eq!(
            format_utc_ms(4_102_444_799 * US_PER_S),
            "2099-12-31T23:59:59.000Z"
        );
    }

    #[test]
    fn dates_round_trip_for_every_day() {
        for day in 0..(200 * 366) {
            let (y, m, d) = civil_from_days(day);
            assert!(d >= 1 && d <= days_in_month(y, m), "{day}: {y}-{m}-{d}");
            assert_eq!(days_from_civil(y, m, d), day);
        }
    }

    #[test]
    fn parses_iso_8601() {
        let now = T + 3_600_000_000;
        let p = |s: &str| parse(s, now);
        assert_eq!(p("2026-11-23T03:51:39.244241Z"), Ok(T));
        assert_eq!(p("2026-11-23T03:51:39.244Z"), Ok(T - 241));
        assert_eq!(p("2026-11-23 03:51:39.244241"), Ok(T));
        assert_eq!(p("2026-11-23t03:51:39,244241z"), Ok(T));
        assert_eq!(p("2026-11-23T05:51:39.244241+02:00"), Ok(T));
        assert_eq!(p("2026-11-23T05:51:39.244241+0200"), Ok(T));
        assert_eq!(p("2026-11-23T01:51:39.244241-02"), Ok(T));
        assert_eq!(p("2026-11-23T03:51Z"), Ok(T - 39_244_241));
        assert_eq!(
            p("2026-11-23"),
            Ok(T - (3 * 3600 + 51 * 60 + 39) * US_PER_S - 244_241)
        );
        assert_eq!(p(&format_utc_ms(T)), Ok(T - 241), "the table's own column");
        assert_eq!(p("1970-01-01T00:00:00Z"), Ok(0));
        for bad in [
            "2026-13-01",
            "2026-02-29",
            "2026-11-22T24:00",
            "2026-11-22T23:60",
            "2026-11-22T23:51:39.Z",
            "2026-11-22T23",
            "2026-11-22T23:51:39.1234567890Z",
            "2026-11-22T23:51+2:00",
            "2026-1-22",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00+01:00",
            "2026-11-22Tnoon",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert_eq!(p("2026-13-01"), Err("month \"13\" is not 1-12".into()));
    }

    #[test]
    fn parses_how_long_ago() {
        let now = T;
        let p = |s: &str| parse(s, now);
        assert_eq!(p("now"), Ok(T));
        assert_eq!(p("0s"), Ok(T));
        assert_eq!(p("90s"), Ok(T - 90 * US_PER_S));
        assert_eq!(p("10m"), Ok(T - 600 * US_PER_S));
        assert_eq!(p("2h"), Ok(T - 7200 * US_PER_S));
        assert_eq!(p("1d"), Ok(T - 86_400 * US_PER_S));
        assert_eq!(p("1w"), Ok(T - 604_800 * US_PER_S));
        assert_eq!(p("1h30m"), Ok(T - 5400 * US_PER_S));
        assert_eq!(p("1.5h"), Ok(T - 5400 * US_PER_S));
        assert_eq!(p(" 10m ago "), Ok(T - 600 * US_PER_S));
        for bad in ["", "10", "10x", "m", "yesterday", "-10m", "1..5h", "10 m"] {
            assert!(p(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse("100w", 5), Err("that is before 1970".into()));
        assert!(p("10").unwrap_err().contains("without a unit"));
    }
}
