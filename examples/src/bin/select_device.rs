//! Lists every device with its kind, then runs on the one named on the command line
//! (`select_device cuda:1`), else the default (`OFFLOAD_DEFAULT_DEVICE`, else the first GPU,
//! else the host).

use offload::{DeviceKind, LaunchDims, Runtime};

fn main() -> offload::Result<()> {
    let rt = Runtime::builder().build()?;
    for d in rt.devices() {
        let kind = match d.kind() {
            DeviceKind::Gpu => "GPU",
            DeviceKind::Cpu => "CPU",
            _ => "other",
        };
        println!(
            "{d}: {} ({kind}, {})",
            d.info()?.name,
            d.info()?.compute_unit_kind
        );
    }
    let device = match std::env::args().nth(1) {
        Some(spec) => rt.device_by_spec(&spec)?,
        None => rt.default_device()?,
    };
    // SAFETY: this crate's own kernels (kernels/, built by its build.rs), whose parameter
    // records are written beside their code.
    let program = unsafe { device.load_trusted(offload::include_kernels!("examples")) }?;
    let mut x = device.upload(&[2.0f32; 64])?;
    program
        .kernel("scale")?
        .launch(LaunchDims::linear(1, 64))
        .arg(64i32)
        .arg(0.5f32)
        .arg(&mut x)
        .run()?;
    let ok = x.to_vec()?.iter().all(|v| *v == 1.0);
    println!("ran on {device}: {}", if ok { "right" } else { "WRONG" });
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
