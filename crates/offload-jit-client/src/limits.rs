//! The resource limits the JIT worker runs under, and how they meet the limits this process
//! inherited.
//!
//! Four resources, each with its own variable: address space (`OFFLOAD_JIT_MEMORY_LIMIT`,
//! default: the machine's memory, at least 4 GiB), CPU time (`OFFLOAD_JIT_CPU_LIMIT`, seconds
//! over the worker's life), file size (`OFFLOAD_JIT_FILE_SIZE_LIMIT`) and open files
//! (`OFFLOAD_JIT_OPEN_FILES_LIMIT`); the last three have no default: the worker keeps what this
//! process has.
//!
//! A process may lower its hard limits, never raise them, and batch systems (or a shell's
//! `ulimit`) set them. So the limit the worker gets never exceeds what this process may have:
//!
//! - a **default** is the smaller of the default and the inherited (soft) limit, and says which
//!   of the two applied;
//! - an **explicit** value above the inherited *hard* limit is an error naming both numbers
//!   (between the soft and the hard limit it is allowed: raising a soft limit up to the hard one
//!   is what soft limits are for);
//! - `none` sets nothing of ours: the inherited limit, if any, still applies, and is reported.
//!
//! The limits are resolved against the inherited ones when the configuration is read (so a bad
//! value is an error of every compile, and `offload info` shows them) and again right before
//! each worker starts, so the child is never asked to exceed a limit that changed since.

use offload_core::text::human_bytes;
use offload_core::{Error, Result, env};

/// A resource the worker's limit is set on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    /// Virtual address space (`RLIMIT_AS`), bytes.
    AddressSpace,
    /// CPU time (`RLIMIT_CPU`), seconds, counted over one worker's life.
    CpuTime,
    /// Size of a file the worker (or a tool it runs, such as `ld.lld`) writes (`RLIMIT_FSIZE`),
    /// bytes.
    FileSize,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    OpenFiles,
}

/// Every resource, in the order they are shown.
pub const RESOURCES: [Resource; 4] = [
    Resource::AddressSpace,
    Resource::CpuTime,
    Resource::FileSize,
    Resource::OpenFiles,
];

/// Smallest address-space limit: below this the worker cannot even map LLVM.
pub const MIN_MEMORY_LIMIT: u64 = 256 << 20;

/// The type of `setrlimit`'s `resource` argument.
#[cfg(target_env = "gnu")]
pub type RawResource = libc::__rlimit_resource_t;
/// The type of `setrlimit`'s `resource` argument.
#[cfg(not(target_env = "gnu"))]
pub type RawResource = libc::c_int;

impl Resource {
    /// The variable that sets it.
    pub fn variable(self) -> &'static str {
        match self {
            Resource::AddressSpace => "OFFLOAD_JIT_MEMORY_LIMIT",
            Resource::CpuTime => "OFFLOAD_JIT_CPU_LIMIT",
            Resource::FileSize => "OFFLOAD_JIT_FILE_SIZE_LIMIT",
            Resource::OpenFiles => "OFFLOAD_JIT_OPEN_FILES_LIMIT",
        }
    }

    /// Its name in `offload info --json`.
    pub fn key(self) -> &'static str {
        match self {
            Resource::AddressSpace => "address_space",
            Resource::CpuTime => "cpu_time",
            Resource::FileSize => "file_size",
            Resource::OpenFiles => "open_files",
        }
    }

    /// What it is, in words.
    pub fn noun(self) -> &'static str {
        match self {
            Resource::AddressSpace => "address space",
            Resource::CpuTime => "CPU time",
            Resource::FileSize => "file size",
            Resource::OpenFiles => "open files",
        }
    }

    /// The kernel's name of the limit.
    pub fn rlimit_name(self) -> &'static str {
        match self {
            Resource::AddressSpace => "RLIMIT_AS",
            Resource::CpuTime => "RLIMIT_CPU",
            Resource::FileSize => "RLIMIT_FSIZE",
            Resource::OpenFiles => "RLIMIT_NOFILE",
        }
    }

    /// The letter of the shell's `ulimit` option that sets it.
    fn ulimit_letter(self) -> char {
        match self {
            Resource::AddressSpace => 'v',
            Resource::CpuTime => 't',
            Resource::FileSize => 'f',
            Resource::OpenFiles => 'n',
        }
    }

    /// The `resource` argument of `getrlimit`/`setrlimit`.
    pub fn raw(self) -> RawResource {
        match self {
            Resource::AddressSpace => libc::RLIMIT_AS,
            Resource::CpuTime => libc::RLIMIT_CPU,
            Resource::FileSize => libc::RLIMIT_FSIZE,
            Resource::OpenFiles => libc::RLIMIT_NOFILE,
        }
    }

    /// A value of this resource for people: `8.0 GiB (8589934592 bytes)`, `600 s`, `64`.
    pub fn show(self, value: Option<u64>) -> String {
        match (self, value) {
            (_, None) => "unlimited".into(),
            (Resource::AddressSpace | Resource::FileSize, Some(v)) => {
                format!("{} ({v} bytes)", human_bytes(v))
            }
            (Resource::CpuTime, Some(v)) => format!("{v} s"),
            (Resource::OpenFiles, Some(v)) => format!("{v} files"),
        }
    }

    /// The values the variable may take, inclusive.
    fn range(self) -> (u64, u64) {
        match self {
            Resource::AddressSpace => (MIN_MEMORY_LIMIT, 1 << 50),
            Resource::CpuTime => (1, 1 << 32),
            Resource::FileSize => (4096, 1 << 60),
            // The worker needs its four channels, LLVM's files and a linker's pipes.
            Resource::OpenFiles => (16, 1 << 20),
        }
    }

    fn expected(self) -> String {
        let (min, max) = self.range();
        let what = match self {
            Resource::AddressSpace | Resource::FileSize => format!(
                "a size from {} to {} (a number of bytes with an optional K, M, G or T suffix)",
                human_bytes(min),
                human_bytes(max)
            ),
            Resource::CpuTime => format!("whole seconds from {min} to {max}"),
            Resource::OpenFiles => format!("a number of files from {min} to {max}"),
        };
        format!("{what}, or none for no limit of the JIT's own")
    }

    /// A value of the variable (`4G`, `600`), if it is one in range.
    pub fn parse(self, text: &str) -> Option<u64> {
        let v = match self {
            Resource::AddressSpace | Resource::FileSize => env::parse_size(text)?,
            Resource::CpuTime | Resource::OpenFiles => text.parse().ok()?,
        };
        let (min, max) = self.range();
        (min..=max).contains(&v).then_some(v)
    }

    /// This process's `(soft, hard)` limit; `None` is unlimited.
    pub fn inherited(self) -> (Option<u64>, Option<u64>) {
        let mut rl = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: `rl` is a valid, writable rlimit; getrlimit has no other preconditions.
        if unsafe { libc::getrlimit(self.raw(), &mut rl) } != 0 {
            return (None, None);
        }
        let finite = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
        (finite(rl.rlim_cur), finite(rl.rlim_max))
    }
}

/// A value in its unit, short: `8.0 GiB`, `600 s`, `64 files`.
fn human(r: Resource, v: u64) -> String {
    match r {
        Resource::AddressSpace | Resource::FileSize => human_bytes(v),
        _ => r.show(Some(v)),
    }
}

/// What the configuration asks of one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ask {
    /// Nothing of the JIT's own: the worker keeps the inherited limit.
    Inherit {
        /// `OFFLOAD_JIT_CPU_LIMIT=none`, or `not set` when no variable asked.
        source: String,
    },
    /// The built-in default: it, or the inherited soft limit where that is smaller.
    Default {
        /// The value.
        value: u64,
        /// What it is (`the machine's memory`).
        what: String,
    },
    /// A value the user set: must be at most the inherited hard limit.
    Explicit {
        /// The value.
        value: u64,
        /// `OFFLOAD_JIT_MEMORY_LIMIT=4G`, or what set it in code.
        source: String,
    },
}

/// One limit as a worker gets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The resource.
    pub resource: Resource,
    /// The limit the worker runs under (its soft limit); `None`: unlimited.
    pub value: Option<u64>,
    /// What the worker's soft limit is set to before it starts (its hard limit stays as
    /// inherited, so a CPU-time limit ends the worker with `SIGXCPU`, not `SIGKILL`); `None`:
    /// left as inherited.
    pub set: Option<u64>,
    /// Why this value: `OFFLOAD_JIT_MEMORY_LIMIT=4G`, `the default (the machine's memory)`,
    /// `inherited (RLIMIT_AS, `ulimit -v`), below the default ...`.
    pub source: String,
}

impl Applied {
    /// `address space 8.0 GiB (...) from OFFLOAD_JIT_MEMORY_LIMIT=8G`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} ({})",
            self.resource.noun(),
            self.resource.show(self.value),
            self.source
        )
    }
}

/// The worker's four limits, as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerLimits {
    asks: Vec<(Resource, Ask)>,
}

impl Default for WorkerLimits {
    /// The defaults: address space limited to the machine's memory (at least 4 GiB), the
    /// others inherited.
    fn default() -> Self {
        WorkerLimits {
            asks: RESOURCES
                .iter()
                .map(|&r| (r, default_ask(r)))
                .collect::<Vec<_>>(),
        }
    }
}

fn default_ask(r: Resource) -> Ask {
    match r {
        Resource::AddressSpace => Ask::Default {
            value: offload_core::fs::physical_memory().max(4 << 30),
            what: "the machine's memory, at least 4 GiB".into(),
        },
        _ => Ask::Inherit {
            source: format!("{} not set", r.variable()),
        },
    }
}

impl WorkerLimits {
    /// Reads the four variables; the first bad one is the error. Values are checked against
    /// the inherited limits too (see [`WorkerLimits::resolve`]).
    pub fn from_env() -> Result<Self> {
        let mut limits = WorkerLimits::default();
        for r in RESOURCES {
            let Some((name, value)) = env::raw(&[r.variable()])? else {
                continue;
            };
            let v = value.trim();
            let ask = if matches!(v.to_ascii_lowercase().as_str(), "none" | "unlimited" | "0") {
                Ask::Inherit {
                    source: format!("{name}={v}"),
                }
            } else {
                match r.parse(v) {
                    Some(value) => Ask::Explicit {
                        value,
                        source: format!("{name}={v}"),
                    },
                    None => {
                        return Err(Error::InvalidArgument(format!(
                            "environment variable {name}='{value}' is not valid: expected {}",
                            r.expected()
                        )));
                    }
                }
            };
            limits.set(r, ask);
        }
        limits.resolve()?;
        Ok(limits)
    }

    /// What is asked of `r`.
    pub fn ask(&self, r: Resource) -> &Ask {
        &self
            .asks
            .iter()
            .find(|(x, _)| *x == r)
            .expect("every resource has an ask")
            .1
    }

    /// Asks `ask` of `r` (from code: a test, an embedding program).
    pub fn set(&mut self, r: Resource, ask: Ask) {
        for (x, a) in &mut self.asks {
            if *x == r {
                *a = ask;
                return;
            }
        }
        self.asks.push((r, ask));
    }

    /// The limits a worker started now gets, against this process's own limits; an explicit
    /// value above the inherited hard limit is the error.
    pub fn resolve(&self) -> Result<Vec<Applied>> {
        self.resolve_against(Resource::inherited)
    }

    /// [`WorkerLimits::resolve`] against given `(soft, hard)` limits (`None`: unlimited).
    pub fn resolve_against(
        &self,
        inherited: impl Fn(Resource) -> (Option<u64>, Option<u64>),
    ) -> Result<Vec<Applied>> {
        RESOURCES
            .iter()
            .map(|&r| {
                let (soft, hard) = inherited(r);
                let soft = match (soft, hard) {
                    (Some(s), Some(h)) => Some(s.min(h)),
                    (s, h) => s.or(h),
                };
                let inherited_text = |how: &str| {
                    format!(
                        "inherited {}, `ulimit -{}`{how}",
                        r.rlimit_name(),
                        r.ulimit_letter()
                    )
                };
                Ok(match self.ask(r) {
                    Ask::Inherit { source } => Applied {
                        resource: r,
                        value: soft,
                        set: None,
                        source: match soft {
                            None => format!("{source}, none inherited"),
                            Some(_) => inherited_text(&format!("; {source}")),
                        },
                    },
                    Ask::Default { value, what } => match soft {
                        Some(s) if s <= *value => Applied {
                            resource: r,
                            value: Some(s),
                            set: None,
                            source: inherited_text(&format!(
                                ", below the default {}, {what}",
                                human(r, *value)
                            )),
                        },
                        _ => Applied {
                            resource: r,
                            value: Some(*value),
                            set: Some(*value),
                            source: format!("{} default: {what}", r.variable()),
                        },
                    },
                    Ask::Explicit { value, source } => {
                        if let Some(h) = hard
                            && *value > h
                        {
                            return Err(Error::InvalidArgument(format!(
                                "{source} asks for a JIT worker limit on {} of {}, above the \
                                 hard limit this process inherited, {} = {} (`ulimit -H{}`); a \
                                 process cannot raise its hard limit: set {} to at most {}, or \
                                 to none to keep the inherited limit",
                                r.noun(),
                                r.show(Some(*value)),
                                r.rlimit_name(),
                                r.show(Some(h)),
                                r.ulimit_letter(),
                                r.variable(),
                                human(r, h),
                            )));
                        }
                        Applied {
                            resource: r,
                            value: Some(*value),
                            set: Some(*value),
                            source: source.clone(),
                        }
                    }
                })
            })
            .collect()
    }
}

/// Sets `limits` on the calling process: for a child between `fork` and `exec`, so it only
/// makes async-signal-safe calls (setrlimit) and allocates nothing.
///
/// # Safety
///
/// Only for the child side of a fork (`Command::pre_exec`): it changes the calling process's
/// limits, which the parent must keep.
pub unsafe fn apply_in_child(limits: &[Applied]) -> std::io::Result<()> {
    for a in limits {
        if let Some(v) = a.set {
            let mut rl = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            // SAFETY: `rl` is a valid, writable rlimit; getrlimit and setrlimit are plain
            // system calls, safe between fork and exec.
            unsafe {
                if libc::getrlimit(a.resource.raw(), &mut rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                rl.rlim_cur = v.min(rl.rlim_max);
                if libc::setrlimit(a.resource.raw(), &rl) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
        }
    }
    Ok(())
}

/// The limit among `limits` on `r`.
pub fn find(limits: &[Applied], r: Resource) -> Option<&Applied> {
    limits.iter().find(|a| a.resource == r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(r: Resource, ask: Ask) -> WorkerLimits {
        let mut l = WorkerLimits::default();
        l.set(r, ask);
        l
    }

    #[test]
    fn a_default_never_exceeds_the_inherited_limit() {
        let l = with(
            Resource::AddressSpace,
            Ask::Default {
                value: 32 << 30,
                what: "test".into(),
            },
        );
        let a = l
            .resolve_against(|r| match r {
                Resource::AddressSpace => (Some(8 << 30), Some(8 << 30)),
                _ => (None, None),
            })
            .unwrap();
        let m = find(&a, Resource::AddressSpace).unwrap();
        assert_eq!(m.value, Some(8 << 30));
        assert_eq!(m.set, None, "the inherited limit is kept, not set again");
        assert!(m.source.contains("inherited") && m.source.contains("below the default"));
        // Under an unlimited parent the default is set.
        let a = l.resolve_against(|_| (None, None)).unwrap();
        let m = find(&a, Resource::AddressSpace).unwrap();
        assert_eq!((m.value, m.set), (Some(32 << 30), Some(32 << 30)));
    }

    #[test]
    fn an_explicit_value_above_the_hard_limit_names_both_numbers() {
        for r in RESOURCES {
            let (min, _) = r.range();
            let hard = min * 4;
            let l = with(
                r,
                Ask::Explicit {
                    value: hard + 1,
                    source: format!("{}=x", r.variable()),
                },
            );
            let e = l
                .resolve_against(|x| {
                    if x == r {
                        (Some(min), Some(hard))
                    } else {
                        (None, None)
                    }
                })
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&r.show(Some(hard + 1))) && e.contains(&r.show(Some(hard))),
                "{r:?}: {e}"
            );
            assert!(
                e.contains(r.variable()) && e.contains(r.rlimit_name()),
                "{e}"
            );
            // Between the soft and the hard limit it is allowed (and set).
            let l = with(
                r,
                Ask::Explicit {
                    value: hard,
                    source: "s".into(),
                },
            );
            let a = l
                .resolve_against(|x| {
                    if x == r {
                        (Some(min), Some(hard))
                    } else {
                        (None, None)
                    }
                })
                .unwrap();
            assert_eq!(find(&a, r).unwrap().set, Some(hard));
        }
    }

    #[test]
    fn inherit_reports_the_inherited_soft_limit() {
        let l = WorkerLimits::default();
        let a = l
            .resolve_against(|r| match r {
                Resource::OpenFiles => (Some(64), Some(128)),
                _ => (None, None),
            })
            .unwrap();
        let n = find(&a, Resource::OpenFiles).unwrap();
        assert_eq!((n.value, n.set), (Some(64), None));
        assert!(n.source.contains("inherited"), "{}", n.source);
        let c = find(&a, Resource::CpuTime).unwrap();
        assert_eq!((c.value, c.set), (None, None));
    }

    #[test]
    fn values_are_parsed_per_resource() {
        assert_eq!(Resource::AddressSpace.parse("4G"), Some(4 << 30));
        assert_eq!(Resource::AddressSpace.parse("1M"), None);
        assert_eq!(Resource::CpuTime.parse("60"), Some(60));
        assert_eq!(Resource::CpuTime.parse("1.5"), None);
        assert_eq!(Resource::FileSize.parse("1K"), None);
        assert_eq!(Resource::FileSize.parse("64K"), Some(64 << 10));
        assert_eq!(Resource::OpenFiles.parse("8"), None);
        assert_eq!(Resource::OpenFiles.parse("256"), Some(256));
    }
}
