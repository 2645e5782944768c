//! Diagnostics: the info log, the debug log and the profile, from the `tracing` events and
//! spans the runtime and the JIT client emit (targets `offload::<kind>`).
//!
//! - `OFFLOAD_INFO` (alias `LIBOMPTARGET_INFO`): a bit mask (decimal or `0x` hex; `all` or -1
//!   for everything) or a comma-separated list of kind names. One line per event of the chosen
//!   kinds on stderr, prefixed `offload: info:`. Bits where upstream has them: `0x01` kernel
//!   arguments (with launches), `0x10` launches, `0x20` copies; this project's: `0x100` plugins
//!   (discovery, refusals), `0x200` images (classification, routing, containers), `0x400` the
//!   JIT (requests, how each was served, the worker), `0x800` memory (allocations, frees),
//!   `0x1000` queues and events (operations through the device API, each on its queue's
//!   track in the profile).
//! - `OFFLOAD_DEBUG` (alias `LIBOMPTARGET_DEBUG`): `0`/`1` or a level (anything above 0 is
//!   on): every event, span and compile phase, with times and threads, prefixed
//!   `offload: debug:`.
//! - `OFFLOAD_PROFILE=FILE` (alias `LIBOMPTARGET_PROFILE`), or `offload run --profile FILE`: a
//!   Chrome trace-event JSON file (Perfetto, `chrome://tracing`) written when the process ends:
//!   one track per thread of this process, and one for the JIT worker's compile phases.
//!
//! Off (nothing set), no subscriber is installed and every event site is one check of
//! `tracing`'s global state.

use crate::json::{Json, obj};
use offload_core::diag;
use offload_core::{Error, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// `OFFLOAD_INFO` and its alias.
pub const ENV_INFO: [&str; 2] = ["OFFLOAD_INFO", "LIBOMPTARGET_INFO"];
/// `OFFLOAD_DEBUG` and its alias.
pub const ENV_DEBUG: [&str; 2] = ["OFFLOAD_DEBUG", "LIBOMPTARGET_DEBUG"];
/// `OFFLOAD_PROFILE` and its alias.
pub const ENV_PROFILE: [&str; 2] = ["OFFLOAD_PROFILE", "LIBOMPTARGET_PROFILE"];

/// The kinds of events, their `OFFLOAD_INFO` bits and names.
pub const KINDS: [(&str, u32); 8] = [
    ("args", 0x01),
    ("launch", 0x10),
    ("copy", 0x20),
    ("plugin", 0x100),
    ("image", 0x200),
    ("jit", 0x400),
    ("memory", 0x800),
    ("queue", 0x1000),
];

/// What the environment (or `--profile`) asks for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `OFFLOAD_INFO` bits.
    pub info: u32,
    /// `OFFLOAD_DEBUG` level (0: off).
    pub debug: u32,
    /// Where to write the profile.
    pub profile: Option<PathBuf>,
}

/// Parses an `OFFLOAD_INFO` value.
pub fn parse_info(value: &str) -> Option<u32> {
    let v = value.trim().to_ascii_lowercase();
    if v == "all" || v == "-1" {
        return Some(u32::MAX);
    }
    if let Some(hex) = v.strip_prefix("0x") {
        return u32::from_str_radix(hex, 16).ok();
    }
    if let Ok(n) = v.parse::<u32>() {
        return Some(n);
    }
    let mut bits = 0;
    for item in v.split(',').map(str::trim) {
        bits |= match item.strip_prefix("0x") {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => match item.parse::<u32>() {
                Ok(n) => n,
                Err(_) => KINDS.iter().find(|(n, _)| *n == item)?.1,
            },
        };
    }
    Some(bits)
}

impl Settings {
    /// Reads the variables; a bad value is an error naming its variable.
    pub fn from_env() -> Result<Settings> {
        let info = match offload_core::env::raw(&ENV_INFO)? {
            None => 0,
            Some((name, value)) => parse_info(&value).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "environment variable {name}='{value}' is not valid: expected a bit mask \
                     (decimal or 0x hex; all or -1 for everything) or kind names separated by \
                     commas ({})",
                    KINDS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ))
            })?,
        };
        let debug = match offload_core::env::raw(&ENV_DEBUG)? {
            None => 0,
            Some((name, value)) => match value.trim().to_ascii_lowercase().as_str() {
                "true" | "yes" | "on" => 1,
                "false" | "no" | "off" => 0,
                v => v.parse::<u32>().map_err(|_| {
                    Error::InvalidArgument(format!(
                        "environment variable {name}='{value}' is not valid: expected 0 (off), \
                         a level of 1 or more (on), or true/false"
                    ))
                })?,
            },
        };
        let profile = match offload_core::env::raw(&ENV_PROFILE)? {
            None => None,
            Some((name, value)) => Some(profile_path(
                Path::new(&value),
                &format!("environment variable {name}='{value}'"),
            )?),
        };
        Ok(Settings {
            info,
            debug,
            profile,
        })
    }

    fn any(&self) -> bool {
        self.info != 0 || self.debug != 0 || self.profile.is_some()
    }
}

/// `path` made absolute, for a profile: its directory must exist. `what` names where it came
/// from, for the error.
fn profile_path(path: &Path, what: &str) -> Result<PathBuf> {
    let p =
        std::path::absolute(path).map_err(|e| Error::InvalidArgument(format!("{what}: {e}")))?;
    if let Some(dir) = p.parent().filter(|d| !d.is_dir()) {
        return Err(Error::InvalidArgument(format!(
            "{what}: directory '{}' does not exist",
            dir.display()
        )));
    }
    Ok(p)
}

static INSTALLED: OnceLock<std::result::Result<Settings, Error>> = OnceLock::new();
static PROFILE: Mutex<Option<Profile>> = Mutex::new(None);

/// Installs the diagnostics the environment asks for (once per process; later calls return
/// the first outcome). `profile` (from `--profile`) overrides `OFFLOAD_PROFILE`.
pub fn init(profile: Option<PathBuf>) -> Result<()> {
    init_with(|| {
        let mut s = Settings::from_env()?;
        if let Some(p) = profile {
            s.profile = Some(profile_path(&p, &format!("--profile '{}'", p.display()))?);
        }
        Ok(s)
    })
}

/// Installs the diagnostics `settings` gives, if none are installed yet (once per process;
/// later calls, and [`init`]'s, return the first outcome). For a front end with rules of its
/// own: the drop-in libomptarget leaves `LIBOMPTARGET_INFO` to upstream's info lines.
pub fn init_with(settings: impl FnOnce() -> Result<Settings>) -> Result<()> {
    INSTALLED
        .get_or_init(|| {
            let s = settings()?;
            if s.any() {
                diag::epoch();
                if let Some(path) = &s.profile {
                    *offload_core::sync::lock(&PROFILE) = Some(Profile {
                        path: path.clone(),
                        events: Vec::new(),
                        threads: HashMap::new(),
                        workers: Vec::new(),
                        queues: HashMap::new(),
                    });
                    // SAFETY: registers a plain extern "C" function; no preconditions.
                    unsafe { libc::atexit(flush_at_exit) };
                }
                let layer = OffloadLayer {
                    info: s.info,
                    debug: s.debug,
                };
                // A subscriber set by the program itself wins; ours is then not installed.
                let _ = tracing_subscriber::registry().with(layer).try_init();
            }
            Ok(s)
        })
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

/// A phase of the calling thread that its caller measured (`offload run`'s `timings_ms`):
/// written to the thread's track of the profile and to the debug log with exactly the caller's
/// times, so the two agree. Returns its length in milliseconds.
pub fn phase(name: &str, start: Instant, end: Instant) -> f64 {
    let ms = end.duration_since(start).as_secs_f64() * 1e3;
    if matches!(INSTALLED.get(), Some(Ok(s)) if s.debug > 0) {
        debug_line("offload::run", &format!("{name} ({ms:.3} ms)"));
    }
    let mut guard = offload_core::sync::lock(&PROFILE);
    if let Some(p) = guard.as_mut() {
        let tid = thread_track(p);
        p.events.push(obj! {
            "name" => name,
            "cat" => "run",
            "ph" => "X",
            "ts" => diag::micros(start),
            "dur" => ms * 1e3,
            "pid" => std::process::id(),
            "tid" => tid,
        });
    }
    ms
}

extern "C" fn flush_at_exit() {
    if let Err(e) = flush_profile() {
        eprintln!("offload: error: {e}");
    }
}

/// Writes the profile now (if one was asked for); later events are written at exit.
pub fn flush_profile() -> Result<()> {
    let mut guard = offload_core::sync::lock(&PROFILE);
    let Some(p) = guard.as_mut() else {
        return Ok(());
    };
    let mut events: Vec<Json> = Vec::new();
    let pid = std::process::id();
    events.push(
        obj! {"ph" => "M", "name" => "process_name", "pid" => pid, "tid" => 0,
        "args" => obj! {"name" => "offload"}},
    );
    for (tid, name) in p.threads.values() {
        events.push(
            obj! {"ph" => "M", "name" => "thread_name", "pid" => pid, "tid" => tid,
            "args" => obj! {"name" => name.as_str()}},
        );
    }
    for (q, tid) in &p.queues {
        events.push(
            obj! {"ph" => "M", "name" => "thread_name", "pid" => pid, "tid" => tid,
            "args" => obj! {"name" => format!("queue {q}")}},
        );
    }
    for w in &p.workers {
        events.push(
            obj! {"ph" => "M", "name" => "process_name", "pid" => w, "tid" => 0,
            "args" => obj! {"name" => "offload-jit-worker"}},
        );
        events.push(
            obj! {"ph" => "M", "name" => "thread_name", "pid" => w, "tid" => 1,
            "args" => obj! {"name" => "compiles"}},
        );
    }
    events.extend(p.events.iter().cloned());
    let text = (obj! {
        "traceEvents" => events,
        "displayTimeUnit" => "ms",
        "otherData" => obj! {"producer" => "offload", "version" => env!("CARGO_PKG_VERSION")},
    })
    .to_text();
    let tmp = p.path.with_extension("tmp-offload");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, &p.path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::System(format!(
                "cannot write the profile '{}': {e}",
                p.path.display()
            ))
        })
}

struct Profile {
    path: PathBuf,
    events: Vec<Json>,
    /// Thread → (trace tid, name).
    threads: HashMap<std::thread::ThreadId, (u64, String)>,
    /// JIT worker pids seen.
    workers: Vec<u64>,
    /// Queue handle → its track.
    queues: HashMap<String, u64>,
}

fn thread_track(p: &mut Profile) -> u64 {
    let t = std::thread::current();
    let n = p.threads.len() as u64 + 1;
    p.threads
        .entry(t.id())
        .or_insert_with(|| {
            (
                n,
                t.name()
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("thread {n}")),
            )
        })
        .0
}

/// Fields of an event or span: its message and the rest.
#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(&'static str, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.rest.push((field.name(), format!("{value:?}")));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.rest.push((field.name(), value.to_string()));
        }
    }
}

impl Fields {
    fn get(&self, name: &str) -> Option<&str> {
        self.rest
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    fn args(&self) -> Json {
        Json::Obj(
            self.rest
                .iter()
                .map(|(k, v)| ((*k).to_string(), Json::from(v.as_str())))
                .collect(),
        )
    }

    /// The info log's text: `message`, and the kernel arguments with their bit (0x01).
    fn text(&self, message: &str, info_bits: u32) -> String {
        let mut s = message.to_string();
        if info_bits & 0x01 != 0
            && let Some(args) = self.get("args")
        {
            s.push_str(&format!(", arguments {args}"));
        }
        s
    }

    /// The debug log's text: `message` and every field.
    fn all(&self, message: &str) -> String {
        let mut s = message.to_string();
        for (k, v) in &self.rest {
            s.push_str(&format!(" {k}={v}"));
        }
        s
    }
}

struct SpanData {
    fields: Fields,
    start: Instant,
}

struct OffloadLayer {
    info: u32,
    debug: u32,
}

impl OffloadLayer {
    /// The kind's name if the info log shows this target's events at this level.
    fn info_on(&self, target: &str, level: &tracing::Level) -> Option<&'static str> {
        let kind = target.strip_prefix("offload::")?;
        let &(name, bit) = KINDS.iter().find(|(n, _)| *n == kind)?;
        (self.info & bit != 0 && *level <= tracing::Level::INFO).then_some(name)
    }
}

fn debug_line(target: &str, text: &str) {
    let t = diag::micros(Instant::now()) / 1000.0;
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("?");
    eprintln!(
        "offload: debug: [{t:10.3} ms {name}] {}: {text}",
        target.strip_prefix("offload::").unwrap_or(target)
    );
}

impl<S> Layer<S> for OffloadLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanData {
                fields,
                start: Instant::now(),
            });
        }
    }

    fn on_record(&self, id: &Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(data) = span.extensions_mut().get_mut::<SpanData>()
        {
            values.record(&mut data.fields);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let meta = span.metadata();
        let ext = span.extensions();
        let Some(data) = ext.get::<SpanData>() else {
            return;
        };
        let end = Instant::now();
        let ms = end.duration_since(data.start).as_secs_f64() * 1e3;
        let label = if data.fields.message.is_empty() {
            meta.name().to_string()
        } else {
            data.fields.message.clone()
        };
        if let Some(kind) = self.info_on(meta.target(), meta.level()) {
            let text = data.fields.text(&label, self.info);
            eprintln!("offload: info: {kind}: {text} ({ms:.3} ms)");
        }
        if self.debug > 0 {
            let text = data.fields.all(&label);
            debug_line(meta.target(), &format!("{text} ({ms:.3} ms)"));
        }
        let mut guard = offload_core::sync::lock(&PROFILE);
        if let Some(p) = guard.as_mut() {
            // Operations on a queue go on the queue's track.
            let tid = match data.fields.get("queue").filter(|q| *q != "0") {
                Some(q) => {
                    let n = 1000 + p.queues.len() as u64;
                    *p.queues.entry(q.to_string()).or_insert(n)
                }
                None => thread_track(p),
            };
            let start = diag::micros(data.start);
            p.events.push(obj! {
                "name" => meta.name(),
                "cat" => meta.target().strip_prefix("offload::").unwrap_or(meta.target()),
                "ph" => "X",
                "ts" => start,
                "dur" => diag::micros(end) - start,
                "pid" => std::process::id(),
                "tid" => tid,
                "args" => obj! {"what" => label, "fields" => data.fields.args()},
            });
        }
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        // Compile phases reported by the worker: a span of their own on the worker's track.
        if let (Some(worker), Some(ts), Some(dur)) = (
            fields.get("worker_pid").and_then(|v| v.parse::<u64>().ok()),
            fields
                .get("phase_ts_us")
                .and_then(|v| v.parse::<f64>().ok()),
            fields
                .get("phase_dur_us")
                .and_then(|v| v.parse::<f64>().ok()),
        ) {
            if self.debug > 0 {
                debug_line(meta.target(), &fields.message);
            }
            let mut guard = offload_core::sync::lock(&PROFILE);
            if let Some(p) = guard.as_mut() {
                if !p.workers.contains(&worker) {
                    p.workers.push(worker);
                }
                p.events.push(obj! {
                    "name" => fields.get("phase").unwrap_or("phase"),
                    "cat" => "jit",
                    "ph" => "X",
                    "ts" => ts,
                    "dur" => dur,
                    "pid" => worker,
                    "tid" => 1,
                    "args" => fields.args(),
                });
            }
            return;
        }
        if let Some(kind) = self.info_on(meta.target(), meta.level()) {
            eprintln!(
                "offload: info: {kind}: {}",
                fields.text(&fields.message, self.info)
            );
        }
        if self.debug > 0 {
            debug_line(meta.target(), &fields.all(&fields.message));
        }
        let mut guard = offload_core::sync::lock(&PROFILE);
        if let Some(p) = guard.as_mut() {
            let tid = thread_track(p);
            p.events.push(obj! {
                "name" => fields.message.as_str(),
                "cat" => meta.target().strip_prefix("offload::").unwrap_or(meta.target()),
                "ph" => "i",
                "s" => "t",
                "ts" => diag::micros(Instant::now()),
                "pid" => std::process::id(),
                "tid" => tid,
                "args" => fields.args(),
            });
        }
    }
}
