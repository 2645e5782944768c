// A view kept after its buffer is dropped.
fn main() -> offload::Result<()> {
    let rt = offload::Runtime::builder().build()?;
    let device = rt.default_device()?;
    let x = device.alloc::<f32>(16)?;
    let view = x.slice(0..8)?;
    drop(x);
    println!("{}", view.len());
    Ok(())
}
