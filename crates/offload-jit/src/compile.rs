//! One compile: parse → check → verify → optimise → generate code, in an LLVM context that is
//! created for this compile and dropped at its end.
//!
//! Everything that would make LLVM abort or exit is checked first: the module's triple against
//! the engine's, the CPU name against the target's processor table, and LLVM's diagnostics are
//! captured by a handler on the context (without one, LLVM exits the process on an error
//! diagnostic).

use crate::cache::{CompileOutput, KernelSignature, ParamType};
use crate::config::JitConfig;
use crate::target_info;
use inkwell::OptimizationLevel;
use inkwell::attributes::AttributeLoc;
use inkwell::context::{AsContextRef, Context};
use inkwell::llvm_sys;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine, TargetTriple,
};
use offload_core::image::{BITCODE_MAGIC, BITCODE_WRAPPER_MAGIC};
use offload_core::{Error, Result};
use std::ffi::{CStr, c_void};
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
    });
}

/// Whether the bytes are LLVM bitcode (raw or wrapped).
pub fn is_bitcode(bytes: &[u8]) -> bool {
    bytes.len() >= 4 && (bytes[..4] == BITCODE_MAGIC || bytes[..4] == BITCODE_WRAPPER_MAGIC)
}

/// Whether the bytes look like textual LLVM IR (the core's classifier decides, so the runtime
/// and the engine agree).
pub fn is_textual_ir(bytes: &[u8]) -> bool {
    offload_core::image::looks_like_llvm_ir(bytes)
}

/// LLVM's canonical form of a triple (`x86_64-linux-gnu` → `x86_64-unknown-linux-gnu`).
pub fn normalize_triple(triple: &str) -> String {
    TargetMachine::normalize_triple(&TargetTriple::create(triple))
        .as_str()
        .to_string_lossy()
        .into_owned()
}

/// Whether a module triple can be compiled by an engine for `engine`: same architecture and
/// same OS (vendor and environment may differ). An empty module triple fits every engine.
pub fn triples_match(module: &str, engine: &str) -> bool {
    if module.is_empty() {
        return true;
    }
    let (m, e) = (normalize_triple(module), normalize_triple(engine));
    let (m, e): (Vec<&str>, Vec<&str>) = (m.split('-').collect(), e.split('-').collect());
    m.first() == e.first() && m.get(2) == e.get(2)
}

/// Reads a module's target triple without materialising its functions (bitcode is loaded
/// lazily; textual IR is scanned for its `target triple` line).
pub fn module_triple(bytes: &[u8]) -> Result<String> {
    if is_bitcode(bytes) {
        return lazy_bitcode_triple(bytes);
    }
    if is_textual_ir(bytes) {
        let text = String::from_utf8_lossy(bytes);
        for line in text.lines() {
            if let Some(rest) = line.trim_start().strip_prefix("target triple") {
                let value = rest.trim_start().trim_start_matches('=').trim();
                return Ok(value.trim_matches('"').to_string());
            }
        }
        return Ok(String::new());
    }
    Err(Error::InvalidImage(
        "not LLVM bitcode (magic 'BC' c0 de or wrapper de c0 17 0b) and not textual IR".into(),
    ))
}

fn lazy_bitcode_triple(bytes: &[u8]) -> Result<String> {
    use llvm_sys::bit_reader::LLVMGetBitcodeModuleInContext2;
    use llvm_sys::core::*;
    let mut diagnostics = Diagnostics::default();
    let context = Context::create();
    install_diagnostic_handler(&context, &mut diagnostics);
    let buffer = MemoryBuffer::create_from_memory_range_copy(bytes, "image");
    let mut module = std::ptr::null_mut();
    // SAFETY: valid context and buffer. The lazy module takes ownership of the buffer on
    // success (so it is forgotten here) and not on failure (dropped normally); errors arrive
    // through the diagnostic handler, which keeps LLVM from exiting.
    unsafe {
        if LLVMGetBitcodeModuleInContext2((&context).as_ctx_ref(), buffer.as_mut_ptr(), &mut module)
            != 0
        {
            let text = if diagnostics.0.is_empty() {
                "unreadable bitcode".to_string()
            } else {
                diagnostics.0.join("; ")
            };
            return Err(Error::InvalidImage(format!(
                "malformed LLVM bitcode: {text}"
            )));
        }
        std::mem::forget(buffer);
        let triple = CStr::from_ptr(LLVMGetTarget(module))
            .to_string_lossy()
            .into_owned();
        LLVMDisposeModule(module);
        Ok(triple)
    }
}

/// # Safety
/// `message` must be null or a string allocated by LLVM.
unsafe fn take_message(message: *mut std::ffi::c_char) -> String {
    if message.is_null() {
        return "(no message)".into();
    }
    // SAFETY: non-null, NUL-terminated, allocated by LLVM (freed right after).
    unsafe {
        let text = CStr::from_ptr(message).to_string_lossy().into_owned();
        llvm_sys::core::LLVMDisposeMessage(message);
        text
    }
}

/// Error diagnostics collected by the context's handler.
#[derive(Default)]
struct Diagnostics(Vec<String>);

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
fn install_diagnostic_handler(context: &Context, diagnostics: &mut Diagnostics) {
    // SAFETY: the handler only touches `diagnostics`, which outlives the context (see above).
    unsafe {
        llvm_sys::core::LLVMContextSetDiagnosticHandler(
            context.as_ctx_ref(),
            Some(diagnostic_handler),
            diagnostics as *mut Diagnostics as *mut c_void,
        );
    }
}

/// What to generate code for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodegenTarget<'a> {
    /// The engine's triple.
    pub triple: &'a str,
    /// The exact CPU (`sm_90`, `gfx90a`, `znver3`).
    pub cpu: &'a str,
    /// Target features, possibly empty.
    pub features: &'a str,
}

/// Whether code for this triple is assembly text (NVPTX: PTX) rather than an object file.
pub fn emits_assembly(triple: &str) -> bool {
    triple.starts_with("nvptx")
}

fn codegen_level(level: u8) -> OptimizationLevel {
    match level {
        0 => OptimizationLevel::None,
        1 => OptimizationLevel::Less,
        2 => OptimizationLevel::Default,
        _ => OptimizationLevel::Aggressive,
    }
}

/// Creates a target machine after checking the triple's target exists and the CPU is one it
/// knows.
pub fn target_machine(t: &CodegenTarget<'_>, opt_level: u8) -> Result<TargetMachine> {
    initialize_targets();
    let triple = TargetTriple::create(t.triple);
    let target = Target::from_triple(&triple).map_err(|e| {
        Error::Unsupported(format!(
            "no LLVM target for triple '{}': {}",
            t.triple,
            e.to_string_lossy()
        ))
    })?;
    let reloc = if emits_assembly(t.triple) || t.triple.starts_with("amdgcn") {
        RelocMode::Default
    } else {
        RelocMode::PIC
    };
    let make = |cpu: &str, features: &str| {
        target
            .create_target_machine(
                &triple,
                cpu,
                features,
                codegen_level(opt_level),
                reloc,
                CodeModel::Default,
            )
            .ok_or_else(|| {
                Error::Unsupported(format!(
                    "LLVM cannot create a target machine for '{}'",
                    t.triple
                ))
            })
    };
    // Probe the CPU on a featureless machine first: creating one with an unknown CPU only
    // prints a warning, so nothing is lost by asking.
    let probe = make("", "")?;
    if t.cpu.is_empty() || !target_info::cpu_is_valid(&probe, t.cpu) {
        let mut known = target_info::cpu_names(&probe);
        known.sort();
        known.dedup();
        return Err(Error::InvalidArgument(format!(
            "CPU '{}' is not a processor LLVM knows for '{}'; known: {}",
            t.cpu,
            t.triple,
            known.join(", ")
        )));
    }
    let tm = make(t.cpu, t.features)?;
    tm.set_asm_verbosity(false);
    Ok(tm)
}

fn parse<'ctx>(context: &'ctx Context, bytes: &[u8], what: &str) -> Result<Module<'ctx>> {
    let buffer = MemoryBuffer::create_from_memory_range_copy(bytes, what);
    if is_bitcode(bytes) {
        Module::parse_bitcode_from_buffer(&buffer, context).map_err(|e| {
            Error::InvalidImage(format!(
                "{what}: malformed LLVM bitcode: {}",
                e.to_string_lossy()
            ))
        })
    } else if is_textual_ir(bytes) {
        context.create_module_from_ir(buffer).map_err(|e| {
            Error::InvalidImage(format!("{what}: invalid LLVM IR: {}", e.to_string_lossy()))
        })
    } else {
        Err(Error::InvalidImage(format!(
            "{what}: neither LLVM bitcode nor textual IR"
        )))
    }
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

/// The exported functions of a module with their parameter types.
fn signatures(module: &Module<'_>) -> Vec<KernelSignature> {
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

/// Compiles `image` (bitcode or IR) to PTX text or an object file.
pub fn compile(image: &[u8], t: &CodegenTarget<'_>, config: &JitConfig) -> Result<CompileOutput> {
    let tm = target_machine(t, config.opt_level)?;
    let mut diagnostics = Diagnostics::default();
    let context = Context::create();
    install_diagnostic_handler(&context, &mut diagnostics);
    let module = match &config.replacement_module {
        Some(r) => parse(
            &context,
            &r.bytes,
            &format!("{}='{}'", r.variable, r.path.display()),
        )?,
        None => parse(&context, image, "image")?,
    };

    let module_triple = module.get_triple().as_str().to_string_lossy().into_owned();
    if !triples_match(&module_triple, t.triple) {
        return Err(Error::InvalidImage(format!(
            "module triple '{module_triple}' does not match the engine's '{}' (LLVM would abort \
             generating code for another target)",
            t.triple
        )));
    }
    if module_triple.is_empty() {
        module.set_triple(&TargetTriple::create(t.triple));
    }
    if module.get_data_layout().as_str().to_bytes().is_empty() {
        module.set_data_layout(&tm.get_target_data().get_data_layout());
    }
    retarget(&module, &context, t.cpu, t.features);
    let signatures = signatures(&module);
    module.verify().map_err(|e| {
        Error::CompileFailure(format!("IR verification failed: {}", e.to_string_lossy()))
    })?;
    if let Some(out) = &config.pre_opt_ir {
        out.write(module.print_to_string().to_bytes())?;
    }
    if !config.skip_opt {
        module
            .run_passes(
                &format!("default<O{}>", config.opt_level),
                &tm,
                PassBuilderOptions::create(),
            )
            .map_err(|e| {
                Error::CompileFailure(format!("optimisation failed: {}", e.to_string_lossy()))
            })?;
    }
    if let Some(out) = &config.post_opt_ir {
        out.write(module.print_to_string().to_bytes())?;
    }
    if let Some(r) = &config.replacement_object {
        return Ok(CompileOutput {
            bytes: r.bytes.clone(),
            signatures,
        });
    }
    let file_type = if emits_assembly(t.triple) {
        FileType::Assembly
    } else {
        FileType::Object
    };
    let out = tm.write_to_memory_buffer(&module, file_type).map_err(|e| {
        Error::CompileFailure(format!("code generation failed: {}", e.to_string_lossy()))
    })?;
    if !diagnostics.0.is_empty() {
        return Err(Error::CompileFailure(diagnostics.0.join("; ")));
    }
    Ok(CompileOutput {
        bytes: out.as_slice().to_vec(),
        signatures,
    })
}
