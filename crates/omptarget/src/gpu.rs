//! OpenMP's GPU kernel protocol as LLVM 19's CUDA and AMDGPU plugins speak it (the reference is
//! LLVM 19.1.7's `offload/plugins-nextgen/common/src/PluginInterface.cpp`, `cuda/src/rtl.cpp`,
//! `amdgpu/src/rtl.cpp` and `offload/include/Shared/Environment.h`; `docs/openmp.md` has the
//! layouts as Debian's device runtimes have them):
//!
//! - every kernel has a `<kernel>_kernel_environment` global (48 bytes): its execution mode
//!   (generic, SPMD, generic-SPMD) and the launch bounds clang derived from `num_teams` /
//!   `thread_limit` / `ompx_attribute`, and the size of its reductions' team buffer. A kernel
//!   without one (`ompx_bare`) is a "bare" kernel, launched in SPMD mode with exactly the
//!   teams and threads the program asked for ([`KernelConfig`]);
//! - teams and threads are chosen from the kernel's bounds, the construct's `num_teams` /
//!   `thread_limit`, the loop's trip count and the device's grid values ([`Grid`],
//!   [`choose`]);
//! - each launch's first argument is the launch environment: `~0` unless the kernel has a
//!   reduction buffer, else a [`LAUNCH_ENV_SIZE`]-byte block in device memory pointing at a
//!   zeroed buffer of `ReductionDataSize * ReductionBufferLength` bytes ([`launch_environment`]);
//! - at load, `__omp_rtl_device_environment` gets the device's environment
//!   ([`device_environment`]) and, on AMD GPUs, `__omp_rtl_device_memory_pool` the heap that
//!   device `malloc` takes from ([`memory_pool`]).

use offload::DeviceInfo;

/// The size of `KernelEnvironmentTy` on 64-bit targets: a 28-byte configuration, padding, and
/// two pointers (`Ident`, `DynamicEnv`).
pub const KERNEL_ENV_SIZE: usize = 48;
/// The bytes of the configuration (`ConfigurationEnvironmentTy`) this library reads.
const CONFIG_SIZE: usize = 28;
/// The size of `KernelLaunchEnvironmentTy`: `u32 ReductionCnt, u32 ReductionIterCnt, ptr
/// ReductionBuffer`.
pub const LAUNCH_ENV_SIZE: usize = 16;
/// The size of `DeviceEnvironmentTy`.
pub const DEVICE_ENV_SIZE: usize = 48;
/// The device environment's global.
pub const DEVICE_ENV: &str = "__omp_rtl_device_environment";
/// The AMD heap's global (`DeviceMemoryPoolTy`: `ptr Ptr, u64 Size`) and its tracker.
pub const MEMORY_POOL: &str = "__omp_rtl_device_memory_pool";
pub const MEMORY_POOL_TRACKER: &str = "__omp_rtl_device_memory_pool_tracker";
/// The AMD heap's size unless `LIBOMPTARGET_HEAP_SIZE` says otherwise (upstream's 512 MiB).
pub const DEFAULT_AMD_HEAP: u64 = 1 << 29;

/// A kernel's execution mode (`OMPTgtExecModeFlags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecMode {
    /// 1: one thread runs the region, the others wait in the state machine for parallel work.
    Generic,
    /// 2: every thread runs the region.
    Spmd,
    /// 3: a generic region the compiler made SPMD.
    GenericSpmd,
}

impl ExecMode {
    /// Upstream's name in the launch info line.
    pub fn name(self) -> &'static str {
        match self {
            ExecMode::Generic => "Generic",
            ExecMode::Spmd => "SPMD",
            ExecMode::GenericSpmd => "Generic-SPMD",
        }
    }
}

/// What the launch needs of a kernel's environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelConfig {
    pub mode: ExecMode,
    /// No kernel environment (`ompx_bare`): teams and threads are the program's own.
    pub bare: bool,
    pub min_threads: i32,
    pub max_threads: i32,
    pub min_teams: i32,
    pub max_teams: i32,
    pub reduction_data_size: u32,
    pub reduction_buffer_length: u32,
}

impl KernelConfig {
    /// A kernel without an environment: upstream's default configuration (SPMD, no bounds).
    pub fn bare() -> KernelConfig {
        KernelConfig {
            mode: ExecMode::Spmd,
            bare: true,
            min_threads: -1,
            max_threads: -1,
            min_teams: -1,
            max_teams: -1,
            reduction_data_size: 0,
            reduction_buffer_length: 0,
        }
    }

    /// Reads the configuration at the start of `bytes` (the kernel environment of `kernel`).
    /// A short global, an unknown execution mode or a negative reduction size is an error
    /// naming the byte.
    pub fn parse(kernel: &str, bytes: &[u8]) -> Result<KernelConfig, String> {
        let global = format!("{kernel}_kernel_environment");
        if bytes.len() < CONFIG_SIZE {
            return Err(format!(
                "'{global}' is {} bytes; LLVM 19's kernel environment is {KERNEL_ENV_SIZE}",
                bytes.len()
            ));
        }
        let mode = match bytes[2] {
            1 => ExecMode::Generic,
            2 => ExecMode::Spmd,
            3 => ExecMode::GenericSpmd,
            m => {
                return Err(format!(
                    "'{global}' byte 2 (the execution mode) is {m}; LLVM 19 knows 1 (generic), \
                     2 (SPMD) and 3 (generic-SPMD)"
                ));
            }
        };
        let word = |at: usize| i32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let size = |at: usize, what: &str| {
            u32::try_from(word(at)).map_err(|_| {
                format!(
                    "'{global}' bytes {at}..{} ({what}) are {}, a negative size",
                    at + 4,
                    word(at)
                )
            })
        };
        Ok(KernelConfig {
            mode,
            bare: false,
            min_threads: word(4),
            max_threads: word(8),
            min_teams: word(12),
            max_teams: word(16),
            reduction_data_size: size(20, "ReductionDataSize")?,
            reduction_buffer_length: size(24, "ReductionBufferLength")?,
        })
    }

    /// The team reduction buffer's size in bytes (0: the launch environment is `~0`).
    pub fn reduction_buffer_bytes(&self) -> u64 {
        u64::from(self.reduction_data_size) * u64::from(self.reduction_buffer_length)
    }
}

/// A device's grid values (`llvm::omp::GV` after the plugin's device initialisation) and the
/// plugin settings that choose teams and threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub warp_size: u32,
    /// `GV_Max_WG_Size` (lowered by `OMP_TEAMS_THREAD_LIMIT`).
    pub thread_limit: u32,
    /// `GV_Max_Teams` (lowered by `OMP_NUM_TEAMS`).
    pub block_limit: u32,
    /// `GV_Default_WG_Size`.
    pub default_threads: u32,
    /// `GV_Default_Num_Teams`.
    pub default_blocks: u32,
    /// `LIBOMPTARGET_MIN_THREADS_FOR_LOW_TRIP_COUNT` (32).
    pub min_threads_low_trip: u32,
    /// `LIBOMPTARGET_REUSE_BLOCKS_FOR_HIGH_TRIP_COUNT` (true).
    pub reuse_blocks: bool,
    /// `LIBOMPTARGET_SHARED_MEMORY_SIZE` (0): dynamic shared memory every launch gets at least.
    pub shared_memory: u32,
}

/// The settings [`Grid`] reads from the environment (each `None` when unset); a bad value is
/// reported and ignored by [`Settings::from_env`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Settings {
    pub num_teams: Option<u32>,
    pub teams_thread_limit: Option<u32>,
    pub min_threads_low_trip: Option<u32>,
    pub reuse_blocks: Option<bool>,
    pub shared_memory: Option<u32>,
    pub amd_teams_per_cu: Option<u32>,
    pub heap_size: Option<u64>,
    pub debug_kind: Option<u32>,
}

fn read<T: std::str::FromStr>(name: &str, expected: &str, valid: impl Fn(&T) -> bool) -> Option<T> {
    match offload_core::env::parsed::<T>(&[name], valid, expected) {
        Ok(v) => v,
        Err(e) => {
            crate::messages::error(&format!("{e}; ignored"));
            None
        }
    }
}

fn boolean(name: &str) -> Option<bool> {
    let v = match offload_core::env::raw(&[name]) {
        Ok(v) => v?.1,
        Err(e) => {
            crate::messages::error(&format!("{e}; ignored"));
            return None;
        }
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" => Some(false),
        _ => {
            crate::messages::error(&format!(
                "environment variable {name}='{v}' is not valid: expected true or false; ignored"
            ));
            None
        }
    }
}

impl Settings {
    /// The variables, read once per process by the caller.
    pub fn from_env() -> Settings {
        let positive = "a positive integer";
        Settings {
            num_teams: read("OMP_NUM_TEAMS", positive, |v: &u32| *v > 0),
            teams_thread_limit: read("OMP_TEAMS_THREAD_LIMIT", positive, |v: &u32| *v > 0),
            min_threads_low_trip: read(
                "LIBOMPTARGET_MIN_THREADS_FOR_LOW_TRIP_COUNT",
                positive,
                |v: &u32| *v > 0,
            ),
            reuse_blocks: boolean("LIBOMPTARGET_REUSE_BLOCKS_FOR_HIGH_TRIP_COUNT"),
            shared_memory: read(
                "LIBOMPTARGET_SHARED_MEMORY_SIZE",
                "a size in bytes",
                |_: &u32| true,
            ),
            amd_teams_per_cu: read("LIBOMPTARGET_AMDGPU_TEAMS_PER_CU", positive, |v: &u32| {
                *v > 0
            }),
            heap_size: read("LIBOMPTARGET_HEAP_SIZE", "a size in bytes", |v: &u64| {
                *v > 0
            }),
            debug_kind: read("LIBOMPTARGET_DEVICE_RTL_DEBUG", "an integer", |_: &u32| {
                true
            }),
        }
    }
}

/// The families whose OpenMP protocol this module speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Nvidia,
    Amd,
}

impl Family {
    /// The family of a plugin (`cuda`, `amdgpu`), if it is a GPU one.
    pub fn of_plugin(name: &str) -> Option<Family> {
        match name {
            "cuda" => Some(Family::Nvidia),
            "amdgpu" => Some(Family::Amd),
            _ => None,
        }
    }

    /// The init and fini kernels LLVM's constructor lowering makes.
    pub fn ctor_kernels(self) -> (&'static str, &'static str) {
        match self {
            Family::Nvidia => ("nvptx$device$init", "nvptx$device$fini"),
            Family::Amd => ("amdgcn.device.init", "amdgcn.device.fini"),
        }
    }
}

impl Grid {
    /// The grid values a device of `family` with `info` has, as the plugins compute them:
    /// NVPTX's (warp 32, 128 threads, 3200 teams) with the CUDA device's block and grid
    /// limits; AMDGPU's (256 threads) with the agent's wavefront, work-group and grid limits
    /// and `compute units * LIBOMPTARGET_AMDGPU_TEAMS_PER_CU` (4) default teams.
    pub fn new(family: Family, info: &DeviceInfo, s: &Settings) -> Grid {
        let l = &info.limits;
        let mut g = match family {
            Family::Nvidia => Grid {
                warp_size: l.warp_size.max(1),
                thread_limit: l.max_block[0].max(1),
                block_limit: l.max_grid[0].max(1),
                default_threads: 128,
                default_blocks: 3200,
                min_threads_low_trip: 32,
                reuse_blocks: true,
                shared_memory: 0,
            },
            Family::Amd => {
                let wg = l.max_block[0].max(1);
                Grid {
                    warp_size: l.warp_size.max(1),
                    thread_limit: wg,
                    // HSA's grid limit counts work items.
                    block_limit: (l.max_grid[0] / wg).max(1),
                    default_threads: 256,
                    default_blocks: info
                        .compute_units
                        .saturating_mul(s.amd_teams_per_cu.unwrap_or(4))
                        .max(1),
                    min_threads_low_trip: 32,
                    reuse_blocks: true,
                    shared_memory: 0,
                }
            }
        };
        if let Some(n) = s.num_teams {
            g.block_limit = g.block_limit.min(n);
        }
        if let Some(n) = s.teams_thread_limit {
            g.thread_limit = g.thread_limit.min(n);
        }
        g.min_threads_low_trip = s.min_threads_low_trip.unwrap_or(g.min_threads_low_trip);
        g.reuse_blocks = s.reuse_blocks.unwrap_or(g.reuse_blocks);
        g.shared_memory = s.shared_memory.unwrap_or(0);
        g
    }
}

/// Threads per team and teams for a launch of `k` (upstream's `getNumThreads` then
/// `getNumBlocks`, for the x dimension, which is all LLVM 19 launches).
pub fn choose(
    g: &Grid,
    k: &KernelConfig,
    num_teams: u32,
    thread_limit: u32,
    trip_count: u64,
) -> (u32, u64) {
    let max_threads = if k.max_threads > 0 {
        (k.max_threads as u32).min(g.thread_limit)
    } else {
        g.thread_limit
    };
    let preferred_threads = if k.min_threads > 0 {
        (k.min_threads as u32).max(g.default_threads)
    } else {
        g.default_threads
    };
    // Threads.
    let mut threads = if k.bare && thread_limit > 0 {
        thread_limit
    } else {
        // The generic mode's main thread runs in a warp of its own.
        let limit = if thread_limit > 0 && k.mode == ExecMode::Generic {
            thread_limit.saturating_add(g.warp_size)
        } else {
            thread_limit
        };
        max_threads.min(if limit > 0 { limit } else { preferred_threads })
    };
    let user_threads = thread_limit > 0;
    // Teams.
    if k.bare && num_teams > 0 {
        return (threads, u64::from(num_teams));
    }
    if num_teams > 0 {
        return (threads, u64::from(num_teams.min(g.block_limit)));
    }
    let default_blocks = u64::from(g.default_blocks);
    let mut trip_blocks = u64::MAX;
    if trip_count > 0 {
        if k.mode == ExecMode::Spmd {
            // A combined `teams distribute parallel for`: a thread per iteration, with fewer
            // threads per team when that leaves too few teams.
            let min_threads = g.min_threads_low_trip.min(threads).max(1);
            let t = u64::from(threads.max(1));
            if trip_count >= default_blocks.saturating_mul(t) || user_threads {
                trip_blocks = (trip_count - 1) / t + 1;
            } else if trip_count >= default_blocks.saturating_mul(u64::from(min_threads)) {
                let per_block = trip_count.div_ceil(default_blocks.max(1));
                let p2 = per_block.checked_next_power_of_two().unwrap_or(u64::MAX);
                threads = threads.min(u32::try_from(p2).unwrap_or(u32::MAX));
                trip_blocks = (trip_count - 1) / u64::from(threads.max(1)) + 1;
            } else {
                threads = threads.min(min_threads);
                trip_blocks = (trip_count - 1) / u64::from(threads.max(1)) + 1;
            }
        } else {
            // `teams distribute` with a nested `parallel for`: a team per iteration.
            trip_blocks = trip_count;
        }
    }
    // Upstream keeps the preferred count in 32 bits (a trip count of 0 leaves `u64::MAX`,
    // which becomes `u32::MAX` and then the block limit).
    let mut preferred = trip_blocks as u32;
    if g.reuse_blocks {
        // Long loops reuse the default number of teams rather than start more.
        preferred = trip_blocks.min(default_blocks) as u32;
    }
    (threads, u64::from(preferred.min(g.block_limit)))
}

/// `DeviceEnvironmentTy` for a device: the runtime debug kind, the plugin's device count and
/// this device's index in it, the dynamic shared memory every launch gets, the clock rate of
/// `omp_get_wtime` on the device, the indirect-call table, and the warps or wavefronts the
/// device holds at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceEnvironment {
    pub debug_kind: u32,
    pub num_devices: u32,
    pub device_num: u32,
    pub dynamic_mem_size: u32,
    pub clock_frequency: u64,
    pub indirect_call_table: u64,
    pub indirect_call_table_size: u64,
    pub hardware_parallelism: u64,
}

impl DeviceEnvironment {
    /// The global's bytes.
    pub fn bytes(&self) -> [u8; DEVICE_ENV_SIZE] {
        let mut b = [0u8; DEVICE_ENV_SIZE];
        b[0..4].copy_from_slice(&self.debug_kind.to_le_bytes());
        b[4..8].copy_from_slice(&self.num_devices.to_le_bytes());
        b[8..12].copy_from_slice(&self.device_num.to_le_bytes());
        b[12..16].copy_from_slice(&self.dynamic_mem_size.to_le_bytes());
        b[16..24].copy_from_slice(&self.clock_frequency.to_le_bytes());
        b[24..32].copy_from_slice(&self.indirect_call_table.to_le_bytes());
        b[32..40].copy_from_slice(&self.indirect_call_table_size.to_le_bytes());
        b[40..48].copy_from_slice(&self.hardware_parallelism.to_le_bytes());
        b
    }
}

/// The device environment of device `index` of `count` of a family. The clock is CUDA's
/// (1 GHz `globaltimer`); AMD's steady-clock rate is an HSA attribute the AMD backend does not
/// report, so it is 0, as upstream sets it when the attribute is missing (`omp_get_wtime` on
/// the device is then inexact). The parallelism is 64 warps per multiprocessor (2048 threads,
/// every NVIDIA GPU since Maxwell but sm_75's 32 and sm_86/89's 48) and 32 wavefronts per
/// compute unit (CDNA).
pub fn device_environment(
    family: Family,
    info: &DeviceInfo,
    (index, count): (usize, usize),
    s: &Settings,
    grid: &Grid,
    (table, table_len): (u64, u64),
) -> DeviceEnvironment {
    let (clock, per_cu) = match family {
        Family::Nvidia => (1_000_000_000, 2048 / u64::from(grid.warp_size.max(1))),
        Family::Amd => (0, 32),
    };
    DeviceEnvironment {
        debug_kind: s.debug_kind.unwrap_or(0),
        num_devices: count as u32,
        device_num: index as u32,
        dynamic_mem_size: grid.shared_memory,
        clock_frequency: clock,
        indirect_call_table: table,
        indirect_call_table_size: table_len,
        hardware_parallelism: u64::from(info.compute_units) * per_cu,
    }
}

/// The launch environment's bytes for a reduction buffer at `buffer`.
pub fn launch_environment(buffer: u64) -> [u8; LAUNCH_ENV_SIZE] {
    let mut b = [0u8; LAUNCH_ENV_SIZE];
    b[8..16].copy_from_slice(&buffer.to_le_bytes());
    b
}

/// `DeviceMemoryPoolTy` for a heap at `ptr` of `size` bytes.
pub fn memory_pool(ptr: u64, size: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&ptr.to_le_bytes());
    b[8..16].copy_from_slice(&size.to_le_bytes());
    b
}

/// `DeviceMemoryPoolTrackingTy`'s initial value: no allocations, minimum `~0`.
pub fn memory_pool_tracker() -> [u8; 32] {
    let mut b = [0u8; 32];
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    b
}

/// The indirect-call table's bytes: `(host, device)` function address pairs sorted by host
/// address, as the device runtime searches it.
pub fn indirect_call_table(mut pairs: Vec<(u64, u64)>) -> Vec<u8> {
    pairs.sort_unstable();
    pairs
        .into_iter()
        .flat_map(|(h, d)| h.to_le_bytes().into_iter().chain(d.to_le_bytes()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Grid {
        Grid {
            warp_size: 32,
            thread_limit: 1024,
            block_limit: i32::MAX as u32,
            default_threads: 128,
            default_blocks: 3200,
            min_threads_low_trip: 32,
            reuse_blocks: true,
            shared_memory: 0,
        }
    }

    fn config(mode: ExecMode, bounds: [i32; 4]) -> KernelConfig {
        KernelConfig {
            mode,
            bare: false,
            min_threads: bounds[0],
            max_threads: bounds[1],
            min_teams: bounds[2],
            max_teams: bounds[3],
            reduction_data_size: 0,
            reduction_buffer_length: 0,
        }
    }

    fn env_bytes(mode: u8, words: [i32; 6]) -> Vec<u8> {
        let mut b = vec![0u8, 0, mode, 0];
        for w in words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.resize(KERNEL_ENV_SIZE, 0xAA);
        b
    }

    /// The kernels clang-19 makes of `tests/omp/gpu_regions.c`, as LLVM 19's plugins launch
    /// them on an H100 (worked through PluginInterface.cpp by hand).
    #[test]
    fn teams_and_threads_as_upstream_chooses_them() {
        let g = h100();
        let spmd = config(ExecMode::Spmd, [1, 128, 0, 0]);
        // 1000 iterations: too few for 3200 teams of 32, so 32 threads a team.
        assert_eq!(choose(&g, &spmd, 0, 0, 1000), (32, 32));
        // 200000 iterations: 3200 teams of 32 would do; a power of two per team.
        assert_eq!(choose(&g, &spmd, 0, 0, 200_000), (64, 3125));
        // 1 << 24: enough for every thread; the default teams are reused.
        assert_eq!(choose(&g, &spmd, 0, 0, 1 << 24), (128, 3200));
        // thread_limit(256) is capped by the kernel's 128; a user's limit keeps the threads.
        assert_eq!(choose(&g, &spmd, 0, 256, 1000), (128, 8));
        // num_teams(7).
        assert_eq!(choose(&g, &spmd, 7, 0, 1000), (128, 7));
        // A plain `target` (generic-SPMD, one team from clang).
        let plain = config(ExecMode::GenericSpmd, [1, 128, -1, -1]);
        assert_eq!(choose(&g, &plain, 1, 0, 0), (128, 1));
        // No trip count and no num_teams: the default teams.
        assert_eq!(choose(&g, &plain, 0, 0, 0), (128, 3200));
        // Generic mode: `thread_limit` gets the main thread's warp.
        let generic = config(ExecMode::Generic, [-1, -1, -1, -1]);
        assert_eq!(choose(&g, &generic, 1, 64, 0), (96, 1));
        // `teams distribute` with a nested parallel: a team per iteration.
        assert_eq!(choose(&g, &generic, 0, 0, 17), (128, 17));
        // A bare kernel runs exactly what was asked.
        let bare = KernelConfig::bare();
        assert_eq!(choose(&g, &bare, 5000, 2000, 0), (2000, 5000));
        // OMP_NUM_TEAMS lowers the block limit.
        let mut low = g;
        low.block_limit = 100;
        assert_eq!(choose(&low, &spmd, 0, 0, 1 << 24), (128, 100));
        assert_eq!(choose(&low, &spmd, 500, 0, 0), (128, 100));
    }

    /// Generated launches: the threads never exceed the kernel's or device's limit, the teams
    /// never exceed the block limit, and an SPMD loop without block reuse gets a thread for
    /// every iteration unless the block limit stops it.
    #[test]
    fn chosen_launches_keep_the_limits() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
        for _ in 0..20_000 {
            let mut g = h100();
            g.thread_limit = 1 + next(1024) as u32;
            g.block_limit = 1 + next(1 << 20) as u32;
            g.default_blocks = 1 + next(5000) as u32;
            g.default_threads = 1 + next(512) as u32;
            g.reuse_blocks = next(2) == 0;
            let mode = [ExecMode::Generic, ExecMode::Spmd, ExecMode::GenericSpmd][next(3) as usize];
            let k = config(mode, [next(300) as i32 - 1, next(1100) as i32 - 1, -1, -1]);
            let (teams, limit) = (
                next(3) as u32 * next(70_000) as u32,
                next(2) as u32 * next(2048) as u32,
            );
            let trip = next(3) * next(1 << 30);
            let (threads, blocks) = choose(&g, &k, teams, limit, trip);
            let max = if k.max_threads > 0 {
                (k.max_threads as u32).min(g.thread_limit)
            } else {
                g.thread_limit
            };
            assert!(
                threads <= max,
                "{g:?} {k:?} {teams} {limit} {trip}: {threads}"
            );
            assert!(blocks <= u64::from(g.block_limit), "{g:?} {k:?}: {blocks}");
            if teams > 0 {
                assert_eq!(blocks, u64::from(teams.min(g.block_limit)));
            }
            if mode == ExecMode::Spmd && teams == 0 && trip > 0 && !g.reuse_blocks && threads > 0 {
                let clamped = blocks == u64::from(g.block_limit);
                assert!(
                    clamped || u64::from(threads) * blocks >= trip,
                    "{g:?} {k:?} {limit} {trip}: {threads} x {blocks}"
                );
            }
        }
    }

    #[test]
    fn kernel_environments_are_read_and_bad_ones_named() {
        let c = KernelConfig::parse("k", &env_bytes(2, [1, 128, 0, 0, 8, 1024])).unwrap();
        assert_eq!(c.mode, ExecMode::Spmd);
        assert_eq!((c.min_threads, c.max_threads), (1, 128));
        assert_eq!(c.reduction_buffer_bytes(), 8 * 1024);
        for mode in [0u8, 4, 7, 255] {
            let e = KernelConfig::parse("k", &env_bytes(mode, [0; 6])).unwrap_err();
            assert!(
                e.contains("'k_kernel_environment' byte 2") && e.contains(&mode.to_string()),
                "{e}"
            );
        }
        let e = KernelConfig::parse("k", &env_bytes(1, [0, 0, 0, 0, -4, 1])).unwrap_err();
        assert!(e.contains("bytes 20..24 (ReductionDataSize)"), "{e}");
        for len in 0..CONFIG_SIZE {
            let e = KernelConfig::parse("k", &env_bytes(1, [0; 6])[..len]).unwrap_err();
            assert!(e.contains(&format!("is {len} bytes")), "{e}");
        }
    }

    #[test]
    fn environments_have_the_device_runtimes_layouts() {
        let env = DeviceEnvironment {
            debug_kind: 1,
            num_devices: 2,
            device_num: 3,
            dynamic_mem_size: 4,
            clock_frequency: 5,
            indirect_call_table: 6,
            indirect_call_table_size: 7,
            hardware_parallelism: 8,
        }
        .bytes();
        let words: Vec<u64> = [0usize, 4, 8, 12]
            .iter()
            .map(|&i| u64::from(u32::from_le_bytes(env[i..i + 4].try_into().unwrap())))
            .chain(
                [16usize, 24, 32, 40]
                    .iter()
                    .map(|&i| u64::from_le_bytes(env[i..i + 8].try_into().unwrap())),
            )
            .collect();
        assert_eq!(words, [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&launch_environment(0x1234)[..8], &[0; 8]);
        assert_eq!(
            u64::from_le_bytes(launch_environment(0x1234)[8..].try_into().unwrap()),
            0x1234
        );
        let t = indirect_call_table(vec![(30, 3), (10, 1), (20, 2)]);
        let firsts: Vec<u64> = t
            .chunks(16)
            .map(|c| u64::from_le_bytes(c[..8].try_into().unwrap()))
            .collect();
        assert_eq!(firsts, [10, 20, 30]);
    }
}
