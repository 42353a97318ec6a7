//! A schedule in words, for people: `every day at 03:00 (Asia/Shanghai)`,
//! `every 30s`, `once at 2026-07-26 03:00:00 UTC`.
//!
//! Common cron shapes are put into words (fixed times on every day, on
//! given weekdays or days of the month, every N seconds/minutes/hours, the
//! macros); anything else is described as "custom" and shown next to the
//! raw expression, never guessed at.

use belfry_protocol::ScheduleSpec;

const DAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// `spec` in words.
pub fn describe(spec: &ScheduleSpec) -> String {
    if let Some(every) = &spec.every {
        let base = format!("every {}", every.trim());
        return match &spec.anchor {
            Some(anchor) => format!("{base} from {anchor}"),
            None => base,
        };
    }
    if let Some(at) = &spec.at {
        return format!("once at {at}");
    }
    if let Some(after) = &spec.after {
        return format!("once, {after} after it was created");
    }
    let Some(cron) = &spec.cron else {
        return "no timetable".into();
    };
    let zone = spec.timezone.as_deref().unwrap_or("UTC");
    match cron_words(cron) {
        // A time of day is read in the zone; a pure repetition is not.
        Some(words) if words.contains(" at ") => format!("{words} ({zone})"),
        Some(words) => words,
        None => format!("custom cron schedule ({zone})"),
    }
}

/// A cron expression in words, when it has a common shape.
pub fn cron_words(expr: &str) -> Option<String> {
    let expr = expr.trim();
    match expr {
        "@yearly" | "@annually" => return Some("every year on January 1 at 00:00".into()),
        "@monthly" => return Some("on day 1 of every month at 00:00".into()),
        "@weekly" => return Some("every Sunday at 00:00".into()),
        "@daily" | "@midnight" => return Some("every day at 00:00".into()),
        "@hourly" => return Some("every hour".into()),
        _ => {}
    }
    let fields: Vec<&str> = expr.split_whitespace().collect();
    let (sec, min, hour, dom, mon, dow) = match fields.as_slice() {
        [s, m, h, d, mo, w] => (*s, *m, *h, *d, *mo, *w),
        [m, h, d, mo, w] => ("0", *m, *h, *d, *mo, *w),
        _ => return None,
    };
    let any = |f: &str| f == "*" || f == "?";
    if !any(mon) {
        return None;
    }
    // Repetition within the day.
    if any(dom) && any(dow) {
        match (sec, min, hour) {
            ("*", "*", "*") => return Some("every second".into()),
            ("0", "*", "*") => return Some("every minute".into()),
            ("0", "0", "*") => return Some("every hour".into()),
            _ => {}
        }
        // Only steps that divide the unit evenly are a true "every N": `*/7`
        // minutes restarts at each hour, `*/90` fires once an hour.
        if let Some(n) = step(sec).filter(|n| any(min) && any(hour) && 60 % n == 0) {
            return Some(format!("every {n} seconds"));
        }
        if let Some(n) = step(min).filter(|n| sec == "0" && any(hour) && 60 % n == 0) {
            return Some(format!("every {n} minutes"));
        }
        if let Some(n) = step(hour).filter(|n| sec == "0" && min == "0" && 24 % n == 0) {
            return Some(format!("every {n} hours"));
        }
    }
    let time = clock(sec, min, hour)?;
    if any(dom) && any(dow) {
        return Some(format!("every day at {time}"));
    }
    if any(dom) {
        return Some(format!("every {} at {time}", weekdays(dow)?));
    }
    if any(dow) {
        let day: u32 = dom.parse().ok().filter(|d| (1..=31).contains(d))?;
        return Some(format!("on day {day} of every month at {time}"));
    }
    None
}

/// `*/n` (or `0/n`) as n.
fn step(field: &str) -> Option<u32> {
    let (base, n) = field.split_once('/')?;
    (base == "*" || base == "0").then_some(())?;
    n.parse().ok().filter(|n| *n > 1)
}

/// Fixed `HH:MM` or `HH:MM:SS`.
fn clock(sec: &str, min: &str, hour: &str) -> Option<String> {
    let num = |f: &str, max: u32| f.parse::<u32>().ok().filter(|v| *v <= max);
    let (s, m, h) = (num(sec, 59)?, num(min, 59)?, num(hour, 23)?);
    Some(if s == 0 {
        format!("{h:02}:{m:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    })
}

/// A day-of-week field (`1`, `MON`, `1-5`, `MON,WED,FRI`) in words.
fn weekdays(field: &str) -> Option<String> {
    let day = |d: &str| -> Option<usize> {
        let upper = d.to_ascii_uppercase();
        if let Ok(n) = upper.parse::<usize>() {
            return (n <= 7).then_some(n % 7);
        }
        DAYS.iter()
            .position(|name| name[..3].eq_ignore_ascii_case(&upper))
    };
    if field == "1-5" || field.eq_ignore_ascii_case("MON-FRI") {
        return Some("weekday (Monday to Friday)".into());
    }
    let mut names = Vec::new();
    for part in field.split(',') {
        match part.split_once('-') {
            Some((a, b)) => names.push(format!("{} to {}", DAYS[day(a)?], DAYS[day(b)?])),
            None => names.push(DAYS[day(part)?].to_owned()),
        }
    }
    Some(names.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cron(expr: &str, tz: Option<&str>) -> String {
        describe(&ScheduleSpec {
            name: "x".into(),
            cron: Some(expr.into()),
            timezone: tz.map(str::to_owned),
            job_type: "noop".into(),
            ..Default::default()
        })
    }

    #[test]
    fn common_shapes_in_words() {
        assert_eq!(
            cron("0 0 3 * * *", Some("Asia/Shanghai")),
            "every day at 03:00 (Asia/Shanghai)"
        );
        assert_eq!(cron("0 30 4 * * *", None), "every day at 04:30 (UTC)");
        assert_eq!(cron("15 30 4 * * *", None), "every day at 04:30:15 (UTC)");
        assert_eq!(
            cron("0 9 * * 1-5", None),
            "every weekday (Monday to Friday) at 09:00 (UTC)"
        );
        assert_eq!(
            cron("0 0 9 * * MON,FRI", None),
            "every Monday, Friday at 09:00 (UTC)"
        );
        assert_eq!(
            cron("0 0 2 1 * *", None),
            "on day 1 of every month at 02:00 (UTC)"
        );
        assert_eq!(cron("*/15 * * * * *", None), "every 15 seconds");
        assert_eq!(cron("0 */5 * * * *", None), "every 5 minutes");
        assert_eq!(cron("0 0 */2 * * *", None), "every 2 hours");
        assert_eq!(cron("0 */7 * * * *", None), "custom cron schedule (UTC)");
        assert_eq!(cron("0 */90 * * * *", None), "custom cron schedule (UTC)");
        assert_eq!(cron("* * * * * *", None), "every second");
        assert_eq!(cron("0 * * * * *", None), "every minute");
        assert_eq!(cron("@hourly", None), "every hour");
        assert_eq!(
            cron("@daily", Some("Europe/London")),
            "every day at 00:00 (Europe/London)"
        );
        assert_eq!(cron("0 15 10 L * ?", None), "custom cron schedule (UTC)");
        assert_eq!(cron("0 0 12 * 6 *", None), "custom cron schedule (UTC)");
    }

    #[test]
    fn intervals_and_one_shots() {
        let every = ScheduleSpec {
            every: Some("30s".into()),
            ..Default::default()
        };
        assert_eq!(describe(&every), "every 30s");
        let at = ScheduleSpec {
            at: Some("2026-07-26T03:00:00Z".into()),
            ..Default::default()
        };
        assert_eq!(describe(&at), "once at 2026-07-26T03:00:00Z");
    }
}
