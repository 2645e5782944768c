// A shared borrow where the typed kernel writes (Out<f32> takes &mut).
use offload::{In, Out};

fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let program = unsafe { device.load_trusted(b"image") }?;
    let add = program.kernel("add")?.typed::<(i32, In<f32>, Out<f32>)>()?;
    let x = device.alloc::<f32>(16)?;
    let y = device.alloc::<f32>(16)?;
    add.launch(offload::LaunchDims::linear(1, 16), (16, &x, &y)).run()
}
