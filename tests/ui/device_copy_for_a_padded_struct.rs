// device_copy_pod! for a type that is not bytemuck::Pod (padding after `a`).
#[derive(Clone, Copy)]
#[repr(C)]
struct Padded {
    a: u8,
    b: u32,
}
offload::device_copy_pod!(Padded);

fn main() {}
