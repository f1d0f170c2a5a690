//! Logging: Monel's events go through `tracing`, so a host program routes them where it
//! routes its own. Without a subscriber of the host's, `MONEL_DEBUG` and
//! `MONEL_DEBUG_SUBSYS` (NCCL's `NCCL_DEBUG` and `NCCL_DEBUG_SUBSYS`) install one that writes
//! `monel LEVEL message` lines to stderr.
//!
//! Warnings (a hostile connection dropped, say) print even without `MONEL_DEBUG`.
//! Subsystems are event targets: `INIT` (`monel::init`: the path each pair took, core
//! sharing, host layout), `COLL` (`monel::coll`: how each collective ran), `TUNING`
//! (`monel::tuning`: the cost model the ranks agreed on), `NET` (`monel::net`: transport
//! counters when a communicator closes; connections a listener dropped).

use std::fmt;

use tracing::level_filters::LevelFilter;
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;

use crate::error::{CclError, Result};

/// The subsystems and their targets.
pub const SUBSYSTEMS: [(&str, &str); 4] = [
    ("INIT", "monel::init"),
    ("COLL", "monel::coll"),
    ("TUNING", "monel::tuning"),
    ("NET", "monel::net"),
];

/// The filter `MONEL_DEBUG` (`INFO`, `DEBUG`, `TRACE`; `WARN` or unset: warnings only,
/// such as a dropped hostile connection) and `MONEL_DEBUG_SUBSYS` (a comma list of
/// subsystems, or `^` and those to leave out; `ALL` for all) ask for. A malformed value is
/// an error naming the variable.
pub fn filter_from(level: Option<&str>, subsys: Option<&str>) -> Result<Targets> {
    let Some(level) = level.map(str::trim).filter(|l| !l.is_empty()) else {
        return Ok(Targets::new().with_target("monel", LevelFilter::WARN));
    };
    let level = match level.to_ascii_uppercase().as_str() {
        "VERSION" | "WARN" => LevelFilter::WARN,
        "INFO" => LevelFilter::INFO,
        "DEBUG" => LevelFilter::DEBUG,
        "TRACE" => LevelFilter::TRACE,
        _ => {
            return Err(CclError::invalid(format!(
                "MONEL_DEBUG={level:?}: want WARN, INFO, DEBUG or TRACE"
            )));
        }
    };
    let mut targets = Targets::new();
    let subsys = subsys.map(str::trim).unwrap_or("ALL");
    let (negate, list) = match subsys.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, subsys),
    };
    let mut named = Vec::new();
    for s in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let s = s.to_ascii_uppercase();
        if s == "ALL" {
            named.extend(SUBSYSTEMS.iter().map(|&(_, t)| t));
            continue;
        }
        let Some(&(_, target)) = SUBSYSTEMS.iter().find(|(n, _)| *n == s) else {
            let names: Vec<&str> = SUBSYSTEMS.iter().map(|(n, _)| *n).collect();
            return Err(CclError::invalid(format!(
                "MONEL_DEBUG_SUBSYS={subsys:?}: {s} is not one of ALL, {}",
                names.join(", ")
            )));
        };
        named.push(target);
    }
    for (_, target) in SUBSYSTEMS {
        let on = named.contains(&target) != negate;
        targets = targets.with_target(target, if on { level } else { LevelFilter::OFF });
    }
    // Events outside the subsystems (warnings from any part of Monel) at the level asked.
    Ok(targets.with_target("monel", level.max(LevelFilter::WARN)))
}

/// Installs the stderr logger `MONEL_DEBUG` asks for (warnings only when it is unset),
/// unless the host program installed a subscriber of its own (then Monel's events go
/// there). Called by every communicator's init and by the `monel` binary; harmless to call
/// again.
pub fn init_from_env() -> Result<()> {
    // Once per process: every communicator's init calls this.
    static DONE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    let level = std::env::var("MONEL_DEBUG").ok();
    let subsys = std::env::var("MONEL_DEBUG_SUBSYS").ok();
    let filter = filter_from(level.as_deref(), subsys.as_deref())?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .event_format(Line);
    let subscriber = tracing_subscriber::registry().with(fmt).with(filter);
    // Fails when the host program set a subscriber of its own: its stays.
    let _ = tracing::subscriber::set_global_default(subscriber);
    let _ = DONE.set(());
    Ok(())
}

/// `monel LEVEL message`, as the logs always read.
struct Line;

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        write!(w, "monel {} ", event.metadata().level())?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}

/// Says once per process that a launcher-started job has no secret, so its ranks are not
/// authenticated (anyone who can reach the rendezvous and computes the launcher's id may
/// join).
pub(crate) fn unauthenticated(launcher: &str) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let _ = init_from_env();
    ONCE.call_once(|| {
        tracing::warn!(
            target: "monel::init",
            "no job secret (MONEL_SECRET_FILE or MONEL_SECRET) for this {launcher} job: \
             ranks are not authenticated, and anyone who can reach MASTER_ADDR may join"
        );
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enabled(t: &Targets, target: &str, level: tracing::Level) -> bool {
        t.would_enable(target, &level)
    }

    #[test]
    fn levels_and_subsystems_map_onto_targets() {
        let t = filter_from(None, Some("INIT")).unwrap();
        assert!(enabled(&t, "monel::init", tracing::Level::WARN));
        assert!(!enabled(&t, "monel::init", tracing::Level::INFO));
        let t = filter_from(Some("INFO"), None).unwrap();
        for (_, target) in SUBSYSTEMS {
            assert!(enabled(&t, target, tracing::Level::INFO), "{target}");
            assert!(!enabled(&t, target, tracing::Level::DEBUG), "{target}");
        }
        let t = filter_from(Some("trace"), Some("INIT,coll")).unwrap();
        assert!(enabled(&t, "monel::init", tracing::Level::TRACE));
        assert!(enabled(&t, "monel::coll", tracing::Level::TRACE));
        assert!(!enabled(&t, "monel::tuning", tracing::Level::ERROR));
        let t = filter_from(Some("DEBUG"), Some("^COLL")).unwrap();
        assert!(!enabled(&t, "monel::coll", tracing::Level::WARN));
        assert!(enabled(&t, "monel::net", tracing::Level::DEBUG));
        assert!(enabled(&t, "monel::other", tracing::Level::WARN));
    }

    #[test]
    fn bad_values_name_their_variable() {
        let e = filter_from(Some("LOUD"), None).unwrap_err();
        assert!(e.message.contains("MONEL_DEBUG="), "{e}");
        let e = filter_from(Some("INFO"), Some("INIT,GRAPHICS")).unwrap_err();
        assert!(e.message.contains("MONEL_DEBUG_SUBSYS"), "{e}");
        assert!(e.message.contains("GRAPHICS"), "{e}");
    }
}
