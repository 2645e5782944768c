//! One compile: check → parse → verify → optimise → generate code, in an LLVM context that is
//! created for this compile and dropped at its end.
//!
//! What can be checked before code generation is checked, because it gives a better message
//! than LLVM's abort would (the worker process is what makes the rest survivable):
//! - the CPU against the target's processor table, and the features against its feature table
//!   (llc-style bare names mean `+name`; unknown names are an error that names them);
//! - the module's triple against the engine's (a module without one is compiled for the
//!   engine's triple, as `llc -mtriple` does);
//! - calls to another target's intrinsics (`llvm.nvvm.*` in x86-64 IR);
//! - functions that ask for a feature the device does not have (`+avx512f` on a CPU without
//!   it would die with `SIGILL` at launch): refused, naming the function and the feature.
//!
//! LLVM's diagnostics are captured by a handler on the context (without one, LLVM exits the
//! process on an error diagnostic).

use crate::target_info;
use inkwell::attributes::AttributeLoc;
use inkwell::context::{AsContextRef, Context};
use inkwell::llvm_sys;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{FileType, InitializationConfig, Target, TargetMachine, TargetTriple};
use offload_core::image::triple::{Triple, arch_family, intrinsic_family, triples_match};
use offload_core::jit::{CompileOutput, JitOptions, JitTarget, KernelSignature, ParamType};
use offload_core::{Error, Result};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Once;

/// Registers the targets this engine can generate code for, once per process.
pub fn initialize_targets() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let config = InitializationConfig::default();
        Target::initialize_x86(&config);
        Target::initialize_aarch64(&config);
        Target::initialize_nvptx(&config);
        Target::initialize_amd_gpu(&config);
        let _ = initialize_spirv();
    });
}

/// The SPIR-V target, if the LLVM this process runs has it (LLVM 19 builds it only on request;
/// Debian's does not): its initialisers are looked up in the loaded libLLVM, since inkwell
/// binds none for LLVM 19. Whether it is there.
fn initialize_spirv() -> bool {
    const PARTS: [&std::ffi::CStr; 4] = [
        c"LLVMInitializeSPIRVTargetInfo",
        c"LLVMInitializeSPIRVTarget",
        c"LLVMInitializeSPIRVTargetMC",
        c"LLVMInitializeSPIRVAsmPrinter",
    ];
    // SAFETY: looking symbols up in the process; each found one is LLVM's `void f(void)`
    // initialiser, called once (under `initialize_targets`'s Once).
    unsafe {
        let found: Vec<*mut libc::c_void> = PARTS
            .iter()
            .map(|name| libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()))
            .collect();
        if found.iter().any(|f| f.is_null()) {
            return false;
        }
        for f in found {
            let init: extern "C" fn() = std::mem::transmute(f);
            init();
        }
    }
    true
}

/// LLVM's canonical form of a triple (`x86_64-linux-gnu` → `x86_64-unknown-linux-gnu`).
pub fn normalize_triple(triple: &str) -> String {
    TargetMachine::normalize_triple(&TargetTriple::create(triple))
        .as_str()
        .to_string_lossy()
        .into_owned()
}

/// Whether code for this triple is assembly text (NVPTX: PTX) rather than an object file.
pub fn emits_assembly(triple: &str) -> bool {
    triple.starts_with("nvptx")
}

/// Error diagnostics collected by the context's handler.
#[derive(Default)]
pub(crate) struct Diagnostics(pub(crate) Vec<String>);

/// # Safety
/// `message` must be null or a string allocated by LLVM.
unsafe fn take_message(message: *mut std::ffi::c_char) -> String {
    if message.is_null() {
        return "(no message)".into();
    }
    // SAFETY: non-null, NUL-terminated, allocated by LLVM (freed right after).
    unsafe {
        let text = std::ffi::CStr::from_ptr(message)
            .to_string_lossy()
            .into_owned();
        llvm_sys::core::LLVMDisposeMessage(message);
        text
    }
}

extern "C" fn diagnostic_handler(info: llvm_sys::prelude::LLVMDiagnosticInfoRef, ctx: *mut c_void) {
    use llvm_sys::LLVMDiagnosticSeverity;
    // SAFETY: `ctx` is the `Diagnostics` registered with the context, alive as long as it;
    // `info` is valid for the duration of the call; the description is ours to free.
    unsafe {
        if llvm_sys::core::LLVMGetDiagInfoSeverity(info) != LLVMDiagnosticSeverity::LLVMDSError {
            return;
        }
        let text = take_message(llvm_sys::core::LLVMGetDiagInfoDescription(info));
        if let Some(d) = (ctx as *mut Diagnostics).as_mut() {
            d.0.push(text);
        }
    }
}

/// Installs the handler. `diagnostics` must be declared before the context so that it is
/// dropped after it (locals drop in reverse order), on every return path.
pub(crate) fn install_diagnostic_handler(context: &Context, diagnostics: &mut Diagnostics) {
    // SAFETY: the handler only touches `diagnostics`, which outlives the context (see above).
    unsafe {
        llvm_sys::core::LLVMContextSetDiagnosticHandler(
            context.as_ctx_ref(),
            Some(diagnostic_handler),
            diagnostics as *mut Diagnostics as *mut c_void,
        );
    }
}

fn known_list(mut names: Vec<String>) -> String {
    names.sort();
    names.dedup();
    names.join(", ")
}

/// The target and a machine for the CPU, after checking that LLVM knows both.
pub(crate) fn target_machine(
    triple: &str,
    cpu: &str,
    features: &str,
    opt: u8,
) -> Result<TargetMachine> {
    initialize_targets();
    let target = Target::from_triple(&TargetTriple::create(triple)).map_err(|e| {
        if triple.starts_with("spirv") {
            return Error::Unsupported(format!(
                "LLVM {} (the JIT's) has no SPIR-V target: it was built without SPIRV in \
                 LLVM_TARGETS_TO_BUILD, as Debian's llvm-19 is, so bitcode for '{triple}' cannot \
                 become SPIR-V here; compile the kernel to SPIR-V ahead of time (docs/level-zero.md) \
                 or run the JIT worker on an LLVM built with that target",
                crate::llvm_version()
            ));
        }
        Error::Unsupported(format!(
            "no LLVM target for triple '{triple}': {}",
            e.to_string_lossy()
        ))
    })?;
    let pic = !(emits_assembly(triple) || triple.starts_with("amdgcn"));
    // Probe on a featureless machine first: creating one with an unknown CPU only prints a
    // warning, so nothing is lost by asking.
    let probe = target_info::create_target_machine(&target, triple, "", "", opt, pic)?;
    if cpu.is_empty() || !target_info::cpu_is_valid(&probe, cpu) {
        return Err(Error::InvalidArgument(format!(
            "CPU '{cpu}' is not a processor LLVM knows for '{triple}'; known: {}",
            known_list(target_info::cpu_names(&probe))
        )));
    }
    let features = normalize_features(&probe, triple, features)?;
    let tm = target_info::create_target_machine(&target, triple, cpu, &features, opt, pic)?;
    tm.set_asm_verbosity(false);
    Ok(tm)
}

/// Parses a feature list (`+a,-b`, or llc's bare `a` meaning `+a`) against the target's feature
/// table; unknown names are an error that lists them.
pub fn normalize_features(tm: &TargetMachine, triple: &str, features: &str) -> Result<String> {
    let known = target_info::feature_names(tm);
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for item in features.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (sign, name) = match item.as_bytes()[0] {
            b'+' | b'-' => (&item[..1], item[1..].trim()),
            _ => ("+", item),
        };
        if name.is_empty() || !known.iter().any(|k| k == name) {
            unknown.push(item.to_string());
        } else {
            out.push(format!("{sign}{name}"));
        }
    }
    if !unknown.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "unknown target feature{} for '{triple}': {}; known: {}",
            if unknown.len() == 1 { "" } else { "s" },
            unknown.join(", "),
            known_list(known)
        )));
    }
    Ok(out.join(","))
}

/// Feature name → enabled, from a normalised list (later entries win, as in LLVM).
fn feature_map(features: &str) -> BTreeMap<&str, bool> {
    features
        .split(',')
        .filter(|s| s.len() > 1)
        .map(|f| (&f[1..], f.starts_with('+')))
        .collect()
}

/// Points every function at the device's CPU when the module was built for another one. The
/// module's own feature list only fits the CPU it was built for, so it is replaced too.
fn retarget(module: &Module<'_>, context: &Context, cpu: &str, features: &str) {
    for f in module.get_functions() {
        let Some(current) = f.get_string_attribute(AttributeLoc::Function, "target-cpu") else {
            continue;
        };
        if current.get_string_value().to_bytes() == cpu.as_bytes() {
            continue;
        }
        f.remove_string_attribute(AttributeLoc::Function, "target-cpu");
        f.add_attribute(
            AttributeLoc::Function,
            context.create_string_attribute("target-cpu", cpu),
        );
        f.remove_string_attribute(AttributeLoc::Function, "target-features");
        if !features.is_empty() {
            f.add_attribute(
                AttributeLoc::Function,
                context.create_string_attribute("target-features", features),
            );
        }
    }
}

/// Refuses functions that enable a feature the device explicitly lacks.
fn check_function_features(module: &Module<'_>, cpu: &str, device: &str) -> Result<()> {
    let device = feature_map(device);
    for f in module.get_functions() {
        let Some(attr) = f.get_string_attribute(AttributeLoc::Function, "target-features") else {
            continue;
        };
        let value = attr.get_string_value().to_string_lossy().into_owned();
        let missing: Vec<String> = value
            .split(',')
            .map(str::trim)
            .filter_map(|feat| feat.strip_prefix('+'))
            .filter(|name| device.get(name) == Some(&false))
            .map(|name| format!("+{name}"))
            .collect();
        if !missing.is_empty() {
            return Err(Error::InvalidImage(format!(
                "function '{}' requires target feature{} {} that the device's CPU '{cpu}' does not \
                 have (its code would stop with an illegal instruction); rebuild it for this CPU \
                 or without those features",
                f.get_name().to_string_lossy(),
                if missing.len() == 1 { "" } else { "s" },
                missing.join(", ")
            )));
        }
    }
    Ok(())
}

/// Refuses calls to intrinsics of another target, which LLVM's code generator aborts on.
fn check_intrinsics(module: &Module<'_>, triple: &str) -> Result<()> {
    let arch = Triple::parse(triple).map(|t| t.arch).unwrap_or_default();
    let ours = arch_family(&arch);
    for f in module.get_functions() {
        let name = f.get_name().to_string_lossy();
        if let Some(family) = intrinsic_family(&name)
            && family != ours
        {
            return Err(Error::InvalidImage(format!(
                "the module uses '{name}', an intrinsic of the {family} target; it cannot be \
                 compiled for '{triple}' (is it IR for another device?)"
            )));
        }
    }
    Ok(())
}

/// The exported functions of a module with their parameter types (for `triple`: see
/// [`LOCAL_ADDRESS_SPACE`]).
fn signatures(module: &Module<'_>, triple: &str) -> Vec<KernelSignature> {
    // Only where a backend places work-group memory from a launch's size: AMD GPUs and
    // SPIR-V (on nvptx, address space 3 is shared memory, which no CUDA kernel parameter is).
    let local_is_size = matches!(
        triple.split('-').next(),
        Some("amdgcn" | "spirv64" | "spirv" | "spir64" | "spir")
    );
    use inkwell::module::Linkage;
    use inkwell::types::BasicMetadataTypeEnum as T;
    module
        .get_functions()
        .filter(|f| f.count_basic_blocks() > 0)
        .filter(|f| !matches!(f.get_linkage(), Linkage::Internal | Linkage::Private))
        .map(|f| KernelSignature {
            name: f.get_name().to_string_lossy().into_owned(),
            params: f
                .get_type()
                .get_param_types()
                .into_iter()
                .map(|p| match p {
                    T::IntType(i) if i.get_bit_width() == 32 => ParamType::I32,
                    T::IntType(i) if i.get_bit_width() == 64 => ParamType::I64,
                    // A pointer to work-group memory (address space 3: amdgcn's LDS, SPIR's
                    // `__local`): the AMD and Level Zero backends take its size from the launch
                    // and place the memory themselves, so the launch passes a 32-bit size.
                    T::PointerType(p)
                        if local_is_size && p.get_address_space() == LOCAL_ADDRESS_SPACE.into() =>
                    {
                        ParamType::I32
                    }
                    T::PointerType(_) => ParamType::Ptr,
                    T::FloatType(t) => match t.print_to_string().to_string_lossy().as_ref() {
                        "float" => ParamType::F32,
                        "double" => ParamType::F64,
                        other => ParamType::Other(other.to_string()),
                    },
                    other => {
                        ParamType::Other(other.print_to_string().to_string_lossy().into_owned())
                    }
                })
                .collect(),
        })
        .collect()
}

/// LLVM's address space of work-group memory on amdgcn and SPIR-V (`__local`, LDS).
const LOCAL_ADDRESS_SPACE: u16 = 3;

unsafe extern "C" {
    /// `cpp/work_groups/`: adds `__offload_wg_<kernel>` work-group functions.
    fn offload_jit_make_work_groups(module: llvm_sys::prelude::LLVMModuleRef) -> i32;
}

/// Links LLVM's OpenMP device runtime into an OpenMP device module for a GPU (nvptx64, amdgcn)
/// that calls it; modules for other targets are left as they are.
///
/// clang's JIT mode (`-fopenmp-target-jit`) embeds the device code before the device link, and
/// with `-nogpulib` (or `-nocudalib`) nothing links the runtime at all: the module declares
/// `__kmpc_target_init`, `__kmpc_parallel_51`, ... and defines none of them, and `ptxas` or
/// `ld.lld` would refuse it. Here, a module with clang's `openmp-device` flag that declares a
/// `__kmpc_` function and defines none gets the runtime of its exact target ([`openmp_device_runtime`] in
/// [`JitOptions::device_runtime_dir`]), as clang links it for an ahead-of-time build: every
/// runtime function the program does not define becomes internal, so the optimiser keeps only
/// what the kernels reach (nothing of the AMD runtime's RPC printing unless a kernel prints);
/// the runtime's globals (`__omp_rtl_device_environment`, the memory pool) stay visible for the
/// plugin to write. Returns whether it linked.
///
/// [`openmp_device_runtime`]: offload_core::jit::openmp_device_runtime
fn link_openmp_device_runtime<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    triple: &str,
    target: &JitTarget,
    options: &JitOptions,
    layout: &str,
) -> Result<bool> {
    use inkwell::module::Linkage;
    if module.get_flag("openmp-device").is_none() {
        return Ok(false);
    }
    let kmpc = |defined: bool| {
        module
            .get_functions()
            .filter(move |f| (f.count_basic_blocks() > 0) == defined)
            .map(|f| f.get_name().to_string_lossy().into_owned())
            .find(|n| n.starts_with("__kmpc_"))
    };
    // A module that defines runtime functions has the runtime already (clang linked
    // `libomptarget.devicertl.a` before embedding it): a second copy would clash.
    if kmpc(true).is_some() {
        return Ok(false);
    }
    let Some(needed) = kmpc(false) else {
        return Ok(false);
    };
    // The host's OpenMP device code calls libomp, which the program has loaded.
    let Some(name) = offload_core::jit::openmp_device_runtime_name(triple, &target.cpu) else {
        return Ok(false);
    };
    let dir = options.device_runtime_dir.as_deref().ok_or_else(|| {
        Error::Unsupported(format!(
            "the OpenMP device module calls '{needed}' and no directory of OpenMP device \
             runtimes is configured (set {})",
            offload_core::jit::ENV_DEVICE_RUNTIME_DIR
        ))
    })?;
    let path =
        offload_core::jit::openmp_device_runtime(dir, triple, &target.cpu).ok_or_else(|| {
            Error::Unsupported(format!(
                "the OpenMP device module calls '{needed}' from LLVM's OpenMP device runtime, \
                 and '{}' does not exist (install libomp-19-dev, or set {} to the directory \
                 that holds {name})",
                dir.join(&name).display(),
                offload_core::jit::ENV_DEVICE_RUNTIME_DIR
            ))
        })?;
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::System(format!(
            "reading the OpenMP device runtime '{}': {e}",
            path.display()
        ))
    })?;
    let what = path.display().to_string();
    let runtime = target_info::parse_module(context, &bytes, &what, layout).map_err(|e| {
        Error::System(format!(
            "the OpenMP device runtime '{what}' is unreadable: {e}"
        ))
    })?;
    let ours: std::collections::HashSet<String> = module
        .get_functions()
        .filter(|f| f.count_basic_blocks() > 0)
        .map(|f| f.get_name().to_string_lossy().into_owned())
        .chain(
            module
                .get_globals()
                .filter(|g| g.get_initializer().is_some())
                .map(|g| g.get_name().to_string_lossy().into_owned()),
        )
        .collect();
    module.link_in_module(runtime).map_err(|e| {
        Error::CompileFailure(format!(
            "linking the OpenMP device runtime '{what}': {}",
            e.to_string_lossy()
        ))
    })?;
    for f in module.get_functions() {
        if f.count_basic_blocks() > 0
            && !ours.contains(f.get_name().to_string_lossy().as_ref())
            && !matches!(f.get_linkage(), Linkage::Internal | Linkage::Private)
        {
            f.set_linkage(Linkage::Internal);
        }
    }
    // The runtime's own globals become internal too (its `weak` configuration constants, such
    // as `__omp_rtl_debug_kind`, then fold away with the debugging code they guard), except
    // the ones the plugin writes at load (`__omp_rtl_device_environment`, the memory pool and
    // its tracker) and LLVM's own (`llvm.used`).
    for g in module.get_globals() {
        let name = g.get_name().to_string_lossy().into_owned();
        if g.get_initializer().is_some()
            && !ours.contains(&name)
            && !name.starts_with("__omp_rtl_device_")
            && !name.starts_with("llvm.")
            && !matches!(g.get_linkage(), Linkage::Internal | Linkage::Private)
        {
            g.set_linkage(Linkage::Internal);
        }
    }
    // The AMD runtime reads the code object version (`__oclc_ABI_version`, from the ROCm device
    // libraries, which clang defines for a full device link): the module's own
    // `amdhsa_code_object_version` flag, else LLVM 19's default (5).
    if let Some(g) = module
        .get_global("__oclc_ABI_version")
        .filter(|g| g.get_initializer().is_none())
    {
        let version = module
            .get_flag("amdhsa_code_object_version")
            .and_then(|m| {
                // The flag's value prints as `i32 500`.
                use inkwell::values::AnyValue;
                let text = m.print_to_string().to_string_lossy().into_owned();
                text.rsplit(' ').next()?.parse::<u64>().ok()
            })
            .filter(|v| (100..=900).contains(v))
            .unwrap_or(500);
        g.set_initializer(&context.i32_type().const_int(version, false));
        g.set_constant(true);
        g.set_linkage(Linkage::Internal);
    }
    Ok(true)
}

/// Compiles `image` (bitcode or IR) to PTX text or an object file for `target`. With
/// `work_groups` (images for the host plugin), each kernel also gets a work-group function
/// (`cpp/work_groups/`) before the module is optimised, unless the module is OpenMP device
/// code (module flag `openmp-device`).
pub fn compile(
    image: &[u8],
    target: &JitTarget,
    options: &JitOptions,
    work_groups: bool,
) -> Result<CompileOutput> {
    initialize_targets();
    let triple = normalize_triple(&target.triple);
    let tm = target_machine(&triple, &target.cpu, &target.features, options.opt_level)?;
    let features = tm.get_feature_string().to_string_lossy().into_owned();
    let layout = tm
        .get_target_data()
        .get_data_layout()
        .as_str()
        .to_string_lossy()
        .into_owned();
    let mut diagnostics = Diagnostics::default();
    let context = Context::create();
    install_diagnostic_handler(&context, &mut diagnostics);
    let (bytes, what) = match &options.replacement_module {
        Some(r) => (
            &r.bytes[..],
            format!("{}='{}'", r.variable, r.path.display()),
        ),
        None => (image, "image".to_string()),
    };
    let module = target_info::parse_module(&context, bytes, &what, &layout).map_err(|e| {
        let kind = if bytes.len() >= 2 && (bytes[..2] == *b"BC" || bytes[..2] == [0xde, 0xc0]) {
            "malformed LLVM bitcode"
        } else {
            "invalid LLVM IR"
        };
        Error::InvalidImage(format!("{what}: {kind}: {e}"))
    })?;

    crate::phases::mark("parse");
    let module_triple = module.get_triple().as_str().to_string_lossy().into_owned();
    if module_triple.is_empty() {
        // Like `llc -mtriple`: a module without a triple is compiled for the device's.
        module.set_triple(&TargetTriple::create(&triple));
    } else if !triples_match(&module_triple, &triple) {
        return Err(Error::InvalidImage(format!(
            "module triple '{module_triple}' does not match the engine's '{triple}' (LLVM would \
             abort generating code for another target)"
        )));
    }
    check_intrinsics(&module, &triple)?;
    if link_openmp_device_runtime(&context, &module, &triple, target, options, &layout)? {
        crate::phases::mark("link OpenMP device runtime");
    }
    retarget(&module, &context, &target.cpu, &features);
    check_function_features(&module, &target.cpu, &features)?;
    let signatures = signatures(&module, &triple);
    module.verify().map_err(|e| {
        Error::CompileFailure(format!("IR verification failed: {}", e.to_string_lossy()))
    })?;
    // An OpenMP device module (clang's `-fopenmp-is-target-device` marks it) is compiled as it
    // is: its kernels are called once and get their parallelism from libomp.
    let work_groups = work_groups && module.get_flag("openmp-device").is_none();
    if work_groups {
        let reserved = |name: &std::ffi::CStr| name.to_bytes().starts_with(b"__offload_wg");
        if let Some(name) = module
            .get_functions()
            .map(|f| f.get_name().to_owned())
            .chain(module.get_globals().map(|g| g.get_name().to_owned()))
            .find(|n| reserved(n))
        {
            return Err(Error::InvalidImage(format!(
                "the module defines '{}': names starting with __offload_wg are what the JIT \
                 makes for the host's work-group functions",
                offload_core::text::bounded(
                    &offload_core::text::printable(&name.to_string_lossy()),
                    200
                )
            )));
        }
        // SAFETY: a verified module of this context; the pass keeps it valid.
        unsafe { offload_jit_make_work_groups(module.as_mut_ptr()) };
        module.verify().map_err(|e| {
            Error::CompileFailure(format!(
                "IR verification failed after making work-group functions: {}",
                e.to_string_lossy()
            ))
        })?;
    }
    crate::phases::mark(if work_groups {
        "verify, work-group functions"
    } else {
        "verify"
    });
    if let Some(out) = &options.pre_opt_ir {
        out.write(module.print_to_string().to_bytes())?;
    }
    if !options.skip_opt {
        let parts = crate::split::parts(&module, options, &triple)?;
        if parts > 1 {
            let bytes = crate::split::compile(
                &module,
                &tm,
                &target.cpu,
                &features,
                options.opt_level,
                parts,
            )?;
            if !diagnostics.0.is_empty() {
                return Err(Error::CompileFailure(diagnostics.0.join("; ")));
            }
            return Ok(CompileOutput { bytes, signatures });
        }
        module
            .run_passes(
                &format!("default<O{}>", options.opt_level),
                &tm,
                PassBuilderOptions::create(),
            )
            .map_err(|e| {
                Error::CompileFailure(format!("optimisation failed: {}", e.to_string_lossy()))
            })?;
    }
    crate::phases::mark("optimize");
    if let Some(out) = &options.post_opt_ir {
        out.write(module.print_to_string().to_bytes())?;
    }
    if let Some(r) = &options.replacement_object {
        return Ok(CompileOutput {
            bytes: r.bytes.clone(),
            signatures,
        });
    }
    let file_type = if emits_assembly(&triple) {
        FileType::Assembly
    } else {
        FileType::Object
    };
    let out = tm.write_to_memory_buffer(&module, file_type).map_err(|e| {
        Error::CompileFailure(format!("code generation failed: {}", e.to_string_lossy()))
    })?;
    crate::phases::mark("codegen");
    if !diagnostics.0.is_empty() {
        return Err(Error::CompileFailure(diagnostics.0.join("; ")));
    }
    Ok(CompileOutput {
        bytes: out.as_slice().to_vec(),
        signatures,
    })
}
