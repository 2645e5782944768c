// A DeviceBuffer<f32> passed where the typed kernel takes its u32 extent.
use offload::{In, Out};

fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let program = unsafe { device.load_trusted(b"image") }?;
    let add = program.kernel("add")?.typed::<(u32, In<f32>, Out<f32>)>()?;
    let x = device.alloc::<f32>(16)?;
    let mut y = device.alloc::<f32>(16)?;
    add.launch(offload::LaunchDims::linear(1, 16), (&x, &x, &mut y)).run()
}
