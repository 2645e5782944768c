//! The launch builder of the Rust API on the real host plugin: launches checked against the
//! kernel's `OFFLOAD_PARAMS` record (extents, element types, what the kernel writes), views as
//! arguments, unchecked launches by name only, queues and queue scopes.

use offload::{In, LaunchDims, Out, Runtime};
use offload_core::rand::XorShift;
use offload_tests::*;

/// Loads `kernels/<name>.c`, built for the host, on `device`.
fn load(device: &offload::Device, name: &str) -> offload::Program {
    offload_tests::load(device, &std::fs::read(host_kernel(name)).unwrap()).unwrap()
}

fn saxpy_reference(a: f32, x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(x, y)| a * x + y).collect()
}

fn host() -> (Runtime, offload::Device) {
    let rt = host_runtime();
    let device = rt.device("host", 0).unwrap();
    (rt, device)
}

#[test]
fn saxpy_through_the_builder_is_checked_and_correct() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let params = saxpy.params().unwrap().unwrap();
    assert_eq!(params.params.len(), 4);
    let n = 1000;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let y: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let dx = device.upload(&x).unwrap();
    let mut dy = device.upload(&y).unwrap();
    saxpy
        .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
        .arg(n)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()
        .unwrap();
    assert_eq!(dy.to_vec().unwrap(), saxpy_reference(2.0, &x, &y));
}

#[test]
fn a_launch_past_a_buffer_is_refused_and_its_neighbour_is_untouched() {
    // The case: saxpy told n = 256 on 16-float buffers returned Ok and overwrote a
    // neighbouring live buffer.
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let dx = device.upload(&[1.0f32; 16]).unwrap();
    let mut dy = device.upload(&[1.0f32; 16]).unwrap();
    let neighbour = device.upload(&[7.0f32; 1024]).unwrap();
    let e = saxpy
        .launch(LaunchDims::for_elems(256, 256).unwrap())
        .arg(256i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("parameter 2 'x' (const float x[n]) may touch 256 element(s) ([n] with n = 256), and the buffer holds 16"),
        "{e}"
    );
    assert_eq!(neighbour.to_vec().unwrap(), vec![7.0f32; 1024]);
    assert_eq!(dy.to_vec().unwrap(), vec![1.0f32; 16]);
}

#[test]
fn arguments_that_do_not_match_the_record_are_refused_naming_the_parameter() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let dims = LaunchDims::linear(1, 16);
    let dx = device.upload(&[1.0f32; 16]).unwrap();
    let mut dy = device.upload(&[1.0f32; 16]).unwrap();
    let mut wrong_type = device.upload(&[1.0f64; 16]).unwrap();
    let err = |r: offload::Result<()>| r.unwrap_err().to_string();
    let e = err(saxpy
        .launch(dims)
        .arg(16i32)
        .arg(2.0f64)
        .arg(&dx)
        .arg(&mut dy)
        .run());
    assert!(
        e.contains("parameter 1 'a' (float a) is a f32; the launch passes a f64"),
        "{e}"
    );
    let e = err(saxpy
        .launch(dims)
        .arg(16u32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run());
    assert!(
        e.contains("parameter 0 'n' (int n) is a i32; the launch passes a u32"),
        "{e}"
    );
    let e = err(saxpy.launch(dims).arg(16i32).arg(2.0f32).arg(&dx).run());
    assert!(
        e.contains("takes 4 argument(s) (int n, float a, const float x[n], float y[n]); the launch passes 3"),
        "{e}"
    );
    // y is written by the kernel: a shared borrow is refused.
    let e = err(saxpy
        .launch(dims)
        .arg(16i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&dy)
        .run());
    assert!(e.contains("parameter 3 'y'") && e.contains("&mut"), "{e}");
    let e = err(saxpy
        .launch(dims)
        .arg(16i32)
        .arg(2.0f32)
        .arg(&dx)
        .arg(&mut wrong_type)
        .run());
    assert!(
        e.contains("its elements are float (f32 in Rust); the launch passes a buffer of f64"),
        "{e}"
    );
    let e = err(saxpy
        .launch(dims)
        .arg(16i32)
        .arg(2.0f32)
        .arg(3i32)
        .arg(&mut dy)
        .run());
    assert!(
        e.contains("parameter 2 'x' (const float x[n]) is a pointer"),
        "{e}"
    );
    let e = err(saxpy
        .launch(dims)
        .arg(16i32)
        .arg(2.0f32)
        .arg_raw(offload::KernelArg::Ptr(dx.ptr()))
        .arg(&mut dy)
        .run());
    assert!(e.contains("raw pointer"), "{e}");
    // A buffer of another device.
    let other = offload::Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None);
    let other = other.device("testdev", 0).unwrap();
    let elsewhere = other.upload(&[0.0f32; 16]).unwrap();
    let e = err(saxpy
        .launch(dims)
        .arg(16i32)
        .arg(2.0f32)
        .arg(&elsewhere)
        .arg(&mut dy)
        .run());
    assert!(
        e.contains("argument 2 is a buffer of another device"),
        "{e}"
    );
    // Nothing ran.
    assert_eq!(dy.to_vec().unwrap(), vec![1.0f32; 16]);
}

#[test]
fn a_kernel_without_a_record_runs_only_unchecked() {
    let so = host_so(
        "unrecorded",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void twice(int n, float *y) {\n\
           unsigned i = offload_global_id_x(); if (i < (unsigned)n) y[i] *= 2.0f; }\n",
    );
    let (_rt, device) = host();
    let program = offload_tests::load(&device, &std::fs::read(so).unwrap()).unwrap();
    let k = program.kernel("twice").unwrap();
    assert!(k.params().is_none());
    let mut y = device.upload(&[1.5f32; 32]).unwrap();
    let e = k
        .launch(LaunchDims::linear(1, 32))
        .arg(32i32)
        .arg(&mut y)
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("kernel 'twice': its image has no OFFLOAD_PARAMS record")
            && e.contains("Launch::unchecked"),
        "{e}"
    );
    // SAFETY: `twice` touches y[0..n) and y holds n = 32 floats.
    unsafe {
        k.launch(LaunchDims::linear(1, 32))
            .arg(32i32)
            .arg(&mut y)
            .unchecked()
            .run()
    }
    .unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![3.0f32; 32]);
}

#[test]
fn views_are_arguments_and_their_extent_is_checked() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let x: Vec<f32> = (0..100).map(|i| i as f32).collect();
    let dx = device.upload(&x).unwrap();
    let mut dy = device.upload(&[1.0f32; 100]).unwrap();
    saxpy
        .launch(LaunchDims::linear(1, 64))
        .arg(10i32)
        .arg(3.0f32)
        .arg(dx.slice(50..60).unwrap())
        .arg(dy.slice_mut(20..30).unwrap())
        .run()
        .unwrap();
    let y = dy.to_vec().unwrap();
    for (i, v) in y.iter().enumerate() {
        let want = if (20..30).contains(&i) {
            3.0 * (i + 30) as f32 + 1.0
        } else {
            1.0
        };
        assert_eq!(*v, want, "element {i}");
    }
    let e = saxpy
        .launch(LaunchDims::linear(1, 64))
        .arg(11i32)
        .arg(3.0f32)
        .arg(dx.slice(50..60).unwrap())
        .arg(dy.slice_mut(..).unwrap())
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("may touch 11 element(s)") && e.contains("holds 10"),
        "{e}"
    );
    // Ranges outside the buffer are errors, not panics.
    assert!(dx.slice(90..101).is_err());
    #[expect(
        clippy::reversed_empty_ranges,
        reason = "a reversed range must be an error"
    )]
    let reversed = 60..50;
    assert!(dx.slice(reversed).is_err());
    assert!(dy.slice_mut(..=100).is_err());
    // Views are copy ends: device-to-device into a range, and reads of a range.
    dy.slice(0..10)
        .unwrap()
        .copy_from(dx.slice(90..).unwrap())
        .unwrap();
    assert_eq!(dy.slice(0..10).unwrap().to_vec().unwrap(), x[90..]);
    dy.slice(10..12).unwrap().fill(-1.0).unwrap();
    assert_eq!(dy.to_vec().unwrap()[9..13], [99.0, -1.0, -1.0, 1.0]);
}

#[test]
fn generated_launches_run_exactly_when_every_buffer_covers_the_extent() {
    // Random element counts, buffer lengths and view offsets: the checked launch refuses
    // exactly when n exceeds a buffer, and when it runs, it changes y[0..n) of its view and
    // nothing around it.
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let mut rng = XorShift(0x1a0c_4b11);
    for round in 0..60 {
        let xlen = 1 + (rng.next_u64() % 300) as usize;
        let ylen = 1 + (rng.next_u64() % 300) as usize;
        let off = (rng.next_u64() % 8) as usize;
        let n = (rng.next_u64() % 320) as i32 - 10;
        let x: Vec<f32> = (0..xlen).map(|i| (i % 17) as f32).collect();
        let dx = device.upload(&x).unwrap();
        let mut dy = device.upload(&vec![1.0f32; ylen + off + 4]).unwrap();
        // A negative n is refused: saxpy compares `i < (unsigned)n`, so it would touch the
        // whole grid.
        let fits = n >= 0 && n as i64 <= xlen as i64 && n as i64 <= ylen as i64;
        let r = saxpy
            .launch(LaunchDims::for_elems(n.max(1) as u64, 64).unwrap())
            .arg(n)
            .arg(2.0f32)
            .arg(&dx)
            .arg(dy.slice_mut(off..off + ylen).unwrap())
            .run();
        assert_eq!(
            r.is_ok(),
            fits,
            "round {round}: n {n}, x {xlen}, y {ylen}: {r:?}"
        );
        let y = dy.to_vec().unwrap();
        for (i, v) in y.iter().enumerate() {
            let inside = fits && i >= off && ((i - off) as i64) < n as i64;
            let want = if inside { 2.0 * x[i - off] + 1.0 } else { 1.0 };
            assert_eq!(*v, want, "round {round}: element {i} (n {n}, off {off})");
        }
    }
}

#[test]
fn extents_of_several_parameters_and_expressions_are_checked() {
    let so = host_so(
        "stencil",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void blur(int nx, int ny, const float *in, float *out) {\n\
           unsigned i = offload_global_id_x();\n\
           if (i < (unsigned)(nx * ny)) out[i] = in[i] + in[i + nx + 2]; }\n\
         OFFLOAD_PARAMS(blur, int nx, int ny, const float in[nx * ny + nx + 2], float out[nx * ny]);\n",
    );
    let (_rt, device) = host();
    let program = offload_tests::load(&device, &std::fs::read(so).unwrap()).unwrap();
    let blur = program.kernel("blur").unwrap();
    let (nx, ny) = (8, 5);
    let input: Vec<f32> = (0..nx * ny + nx + 2).map(|i| i as f32).collect();
    let din = device.upload(&input).unwrap();
    let mut dout = device.alloc::<f32>((nx * ny) as usize).unwrap();
    blur.launch(LaunchDims::linear(1, 64))
        .arg(nx)
        .arg(ny)
        .arg(&din)
        .arg(&mut dout)
        .run()
        .unwrap();
    let out = dout.to_vec().unwrap();
    for i in 0..(nx * ny) as usize {
        assert_eq!(out[i], input[i] + input[i + nx as usize + 2]);
    }
    let short = device.upload(&input[..input.len() - 1]).unwrap();
    let e = blur
        .launch(LaunchDims::linear(1, 64))
        .arg(nx)
        .arg(ny)
        .arg(&short)
        .arg(&mut dout)
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("may touch 50 element(s) ([nx * ny + nx + 2] with nx = 8, ny = 5), and the buffer holds 49"),
        "{e}"
    );
}

#[test]
fn launches_with_more_arguments_than_the_builder_keeps_inline_are_checked_the_same() {
    // Nine parameters (the builder keeps six inline, then moves to the heap), a literal
    // extent and a parameter one: every count from 0 to 9 arguments is tried, and a short
    // buffer in the ninth position is refused, naming it.
    let so = host_so(
        "nine-args",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void nine(int n, float a, float b, float c, float d, float e, double f,\n\
                                  const float x[4], float y[n]) {\n\
           unsigned i = offload_global_id_x();\n\
           if (i < (unsigned)n) y[i] = a * x[i % 4] + b + c + d + e + (float)f; }\n\
         OFFLOAD_PARAMS(nine, int n, float a, float b, float c, float d, float e, double f,\n\
                        const float x[4], float y[n]);\n",
    );
    let (_rt, device) = host();
    let program = offload_tests::load(&device, &std::fs::read(so).unwrap()).unwrap();
    let nine = program.kernel("nine").unwrap();
    let x = device.upload(&[1.0f32, 2.0, 3.0, 4.0]).unwrap();
    let short_x = device.upload(&[1.0f32, 2.0, 3.0]).unwrap();
    let mut y = device.upload(&[0.0f32; 10]).unwrap();
    for count in 0..9 {
        let mut l = nine.launch(LaunchDims::linear(1, 16));
        let scalars = [0.5f32, 1.0, 2.0, 3.0, 4.0];
        for i in 0..count {
            match i {
                0 => l.arg(10i32),
                1..=5 => l.arg(scalars[i - 1]),
                6 => l.arg(5.0f64),
                _ => l.arg(&x),
            };
        }
        let e = l.run().unwrap_err().to_string();
        assert!(
            e.contains("takes 9 argument(s)") && e.contains(&format!("passes {count}")),
            "{count}: {e}"
        );
    }
    let run = |x: &offload::DeviceBuffer<f32>, y: &mut offload::DeviceBuffer<f32>, n: i32| {
        nine.launch(LaunchDims::linear(1, 16))
            .arg(n)
            .arg(0.5f32)
            .arg(1.0f32)
            .arg(2.0f32)
            .arg(3.0f32)
            .arg(4.0f32)
            .arg(5.0f64)
            .arg(x)
            .arg(y)
            .run()
    };
    run(&x, &mut y, 10).unwrap();
    let want: Vec<f32> = (0..10)
        .map(|i| 0.5 * [1.0, 2.0, 3.0, 4.0][i % 4] + 15.0)
        .collect();
    assert_eq!(y.to_vec().unwrap(), want);
    let e = run(&x, &mut y, 11).unwrap_err().to_string();
    assert!(
        e.contains("parameter 8 'y' (float y[n]) may touch 11 element(s) ([n] with n = 11), and the buffer holds 10"),
        "{e}"
    );
    let e = run(&short_x, &mut y, 10).unwrap_err().to_string();
    assert!(
        e.contains("parameter 7 'x' (const float x[4]) may touch 4 element(s) ([4] with constants only), and the buffer holds 3"),
        "{e}"
    );
    // Nothing ran for the refused launches.
    assert_eq!(y.to_vec().unwrap(), want);
}

#[test]
fn unreadable_records_are_reported_by_the_checked_launch_only() {
    // Records written by hand, past the header's compile-time check.
    let so = host_so(
        "bad-records",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void k1(int n, float *y) { if (n > 0) y[0] = 1.0f; }\n\
         __attribute__((used, visibility(\"default\"))) const char __offload_params_k1[] = \"int n, float y[m]\";\n\
         OFFLOAD_KERNEL void k2(int n, float *y) { if (n > 0) y[0] = 2.0f; }\n\
         __attribute__((used, visibility(\"default\"))) const char __offload_params_k2[] = \"int n, float y[n] %\";\n",
    );
    let (_rt, device) = host();
    let program = offload_tests::load(&device, &std::fs::read(so).unwrap()).unwrap();
    let mut y = device.upload(&[0.0f32; 4]).unwrap();
    for (k, want) in [
        (
            "k1",
            "the extent names 'm', which is not an earlier parameter",
        ),
        ("k2", "'%' at byte"),
    ] {
        let kernel = program.kernel(k).unwrap();
        assert!(matches!(kernel.params(), Some(Err(_))), "{k}");
        let e = kernel
            .launch(LaunchDims::linear(1, 1))
            .arg(1i32)
            .arg(&mut y)
            .run()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!(
                "kernel '{k}': its OFFLOAD_PARAMS record is unusable: __offload_params_{k}"
            )) && e.contains(want),
            "{e}"
        );
    }
}

#[test]
fn mutated_records_in_the_image_never_crash_the_process() {
    // The record's text is in the image's read-only data: mutate its bytes in the file, load,
    // look the kernel up and try a checked launch. Each try is an error or a correct run.
    let so = std::fs::read(host_kernel("saxpy")).unwrap();
    let text = b"int n, float a, const float x[n], float y[n]";
    let at = so
        .windows(text.len())
        .position(|w| w == text)
        .expect("the record's text is in the image");
    let (_rt, device) = host();
    let mut rng = XorShift(0x7e57_ab1e);
    let alphabet = b"intfloa[]()*+-, 0123456789xyzn%\0\xff";
    let mut ran = 0;
    for round in 0..150 {
        let mut image = so.clone();
        for _ in 0..1 + rng.next_u64() % 3 {
            let i = at + (rng.next_u64() % text.len() as u64) as usize;
            image[i] = alphabet[(rng.next_u64() % alphabet.len() as u64) as usize];
        }
        let program = offload_tests::load(&device, &image).unwrap();
        let k = program.kernel("saxpy").unwrap();
        let dx = device.upload(&[1.0f32; 64]).unwrap();
        let mut dy = device.upload(&[1.0f32; 64]).unwrap();
        let guard = device.upload(&[5.0f32; 64]).unwrap();
        let r = k
            .launch(LaunchDims::linear(1, 64))
            .arg(64i32)
            .arg(2.0f32)
            .arg(&dx)
            .arg(&mut dy)
            .run();
        if r.is_ok() {
            ran += 1;
            assert_eq!(dy.to_vec().unwrap(), vec![3.0f32; 64], "round {round}");
        }
        assert_eq!(guard.to_vec().unwrap(), vec![5.0f32; 64], "round {round}");
    }
    assert!(ran < 150, "some mutations must be refused");
}

#[test]
fn bitcode_kernels_carry_the_same_record_through_the_jit() {
    let (_rt, device) = host();
    let program =
        offload_tests::load(&device, &std::fs::read(host_bitcode("saxpy")).unwrap()).unwrap();
    let saxpy = program.kernel("saxpy").unwrap();
    assert!(
        matches!(saxpy.params(), Some(Ok(_))),
        "{:?}",
        saxpy.params()
    );
    let dx = device.upload(&[2.0f32; 8]).unwrap();
    let mut dy = device.upload(&[1.0f32; 8]).unwrap();
    let e = saxpy
        .launch(LaunchDims::linear(1, 32))
        .arg(9i32)
        .arg(1.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("may touch 9 element(s)"), "{e}");
    saxpy
        .launch(LaunchDims::linear(1, 32))
        .arg(8i32)
        .arg(1.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .run()
        .unwrap();
    assert_eq!(dy.to_vec().unwrap(), vec![3.0f32; 8]);
}

#[test]
fn launches_on_queues_and_in_queue_scopes_borrow_what_they_use() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let n = 4096;
    let x: Vec<f32> = (0..n).map(|i| (i % 100) as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| (i % 3) as f32).collect();
    let dx = device.alloc::<f32>(n).unwrap();
    let mut dy = device.alloc::<f32>(n).unwrap();
    let mut out = vec![0.0f32; n];
    let queue = device.queue().unwrap();
    queue
        .scope(|s| {
            s.write(&dx, &x)?;
            s.write(&dy, &y)?;
            saxpy
                .launch(LaunchDims::for_elems(n as u64, 256)?)
                .arg(n as i32)
                .arg(0.5f32)
                .arg(&dx)
                .arg(&dy)
                .on(s)
                .run()
        })
        .unwrap();
    // The scope synchronised: the result is there, read synchronously.
    assert_eq!(dy.to_vec().unwrap(), saxpy_reference(0.5, &x, &y));
    // Upload, launch and download in one scope: a written buffer may be borrowed shared on a
    // queue, which orders the work.
    queue
        .scope(|s| {
            s.write(&dy, &y)?;
            saxpy
                .launch(LaunchDims::for_elems(n as u64, 256)?)
                .arg(n as i32)
                .arg(0.5f32)
                .arg(&dx)
                .arg(&dy)
                .on(s)
                .run()?;
            s.read(&mut out, &dy)
        })
        .unwrap();
    assert_eq!(out, saxpy_reference(0.5, &x, &y));
    // A kernel looked up inside the scope launches on it: only the buffers are borrowed for
    // the scope, not the kernel.
    queue
        .scope(|s| {
            s.write(&dy, &y)?;
            let inner = program.kernel("saxpy")?;
            inner
                .launch(LaunchDims::for_elems(n as u64, 256)?)
                .arg(n as i32)
                .arg(0.5f32)
                .arg(&dx)
                .arg(&dy)
                .on(s)
                .run()
        })
        .unwrap();
    assert_eq!(dy.to_vec().unwrap(), saxpy_reference(0.5, &x, &y));
    // On a plain queue the borrow ends at the call; a synchronous read waits for the launch.
    saxpy
        .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
        .arg(n as i32)
        .arg(1.0f32)
        .arg(&dx)
        .arg(&mut dy)
        .on(&queue)
        .run()
        .unwrap();
    let want: Vec<f32> = saxpy_reference(0.5, &x, &y)
        .iter()
        .zip(&x)
        .map(|(y, x)| x + y)
        .collect();
    assert_eq!(dy.to_vec().unwrap(), want);
    // A scope's error is the first failing operation's, and the queue is still drained.
    let long = vec![0.0; n + 1];
    let e = queue
        .scope(|s| {
            s.write(&dx, &x)?;
            s.write(&dx, &long)
        })
        .unwrap_err()
        .to_string();
    assert!(e.contains("the lengths must be equal"), "{e}");
}

#[test]
fn typed_kernels_are_checked_once_and_launch_with_tuples() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program
        .kernel("saxpy")
        .unwrap()
        .typed::<(i32, f32, In<f32>, Out<f32>)>()
        .unwrap();
    let x = device.upload(&[1.0f32; 64]).unwrap();
    let mut y = device.upload(&[0.5f32; 64]).unwrap();
    saxpy
        .launch(LaunchDims::linear(1, 64), (64, 2.0, &x, &mut y))
        .run()
        .unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![2.5f32; 64]);
    // Extents are still checked per launch.
    let e = saxpy
        .launch(LaunchDims::linear(1, 64), (65, 2.0, &x, &mut y))
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("may touch 65 element(s)"), "{e}");
    // On a queue.
    let queue = device.queue().unwrap();
    saxpy
        .launch(LaunchDims::linear(1, 64), (64, 1.0, &x, &mut y))
        .on(&queue)
        .run()
        .unwrap();
    assert_eq!(y.to_vec().unwrap(), vec![3.5f32; 64]);
    // Ranges of buffers: y[16..48] += 2 * x[32..64]; the rest of y is untouched, and the
    // extent is checked against the range, not the whole buffer.
    saxpy
        .launch(
            LaunchDims::linear(1, 32),
            (
                32,
                2.0,
                x.slice(32..).unwrap(),
                y.slice_mut(16..48).unwrap(),
            ),
        )
        .run()
        .unwrap();
    let got = y.to_vec().unwrap();
    for (i, v) in got.iter().enumerate() {
        let want = if (16..48).contains(&i) { 5.5 } else { 3.5 };
        assert_eq!(*v, want, "y[{i}]");
    }
    let e = saxpy
        .launch(
            LaunchDims::linear(1, 64),
            (
                33,
                2.0,
                x.slice(32..).unwrap(),
                y.slice_mut(16..48).unwrap(),
            ),
        )
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("may touch 33 element(s)"), "{e}");
    // Two disjoint exclusive ranges of one buffer in one launch (split_at_mut), on a queue.
    let (lo, hi) = y.split_at_mut(32).unwrap();
    queue
        .scope(|s| {
            saxpy
                .launch(LaunchDims::linear(1, 32), (32, 1.0, hi.view(), lo))
                .on(s)
                .run()
        })
        .unwrap();
    assert_eq!(y.to_vec().unwrap()[..16], vec![3.5f32 + 5.5; 16]);
    // Rust types that do not match the record are refused once, naming the parameter.
    let k = || program.kernel("saxpy").unwrap();
    for (e, want) in [
        (
            k().typed::<(i32, f64, In<f32>, Out<f32>)>().unwrap_err(),
            "parameter 1 'a' (float a)",
        ),
        (
            k().typed::<(i32, f32, In<f32>, In<f32>)>().unwrap_err(),
            "parameter 3 'y' (float y[n]): the kernel may write through it: Out<f32>, not In",
        ),
        (
            k().typed::<(i32, f32, In<f64>, Out<f32>)>().unwrap_err(),
            "parameter 2 'x' (const float x[n]): its elements are const float; the Rust type says f64",
        ),
        (
            k().typed::<(i32, f32, In<f32>)>().unwrap_err(),
            "it takes 4 argument(s)",
        ),
    ] {
        assert!(e.to_string().contains(want), "{e}");
    }
    // Disjoint mutable views of one buffer, written by two launches.
    let scale = host_so(
        "scale",
        "#include \"offload_kernel.h\"\n\
         OFFLOAD_KERNEL void scale(int n, float a, float *x) {\n\
           unsigned i = offload_global_id_x(); if (i < (unsigned)n) x[i] *= a; }\n\
         OFFLOAD_PARAMS(scale, int n, float a, float x[n]);\n",
    );
    let p2 = offload_tests::load(&device, &std::fs::read(scale).unwrap()).unwrap();
    let scale = p2.kernel("scale").unwrap();
    let mut z = device.upload(&[1.0f32; 10]).unwrap();
    let (lo, hi) = z.split_at_mut(4).unwrap();
    scale
        .launch(LaunchDims::linear(1, 8))
        .arg(4i32)
        .arg(2.0f32)
        .arg(lo)
        .run()
        .unwrap();
    scale
        .launch(LaunchDims::linear(1, 8))
        .arg(6i32)
        .arg(3.0f32)
        .arg(hi)
        .run()
        .unwrap();
    assert_eq!(
        z.to_vec().unwrap(),
        [2.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    );
    assert!(z.split_at_mut(11).is_err());
}

#[test]
fn globals_are_typed_views_for_copies_and_arguments() {
    let so = host_so(
        "globals",
        "#include \"offload_kernel.h\"\n\
         __attribute__((visibility(\"default\"))) float table[16] = {0.0f, 1.5f, 3.0f, 4.5f, 6.0f, 7.5f, 9.0f, 10.5f, 12.0f, 13.5f, 15.0f, 16.5f, 18.0f, 19.5f, 21.0f, 22.5f};\n\
         __attribute__((visibility(\"default\"))) char odd[10];\n\
         OFFLOAD_KERNEL void lookup(int n, const int *idx, float *out) {\n\
           unsigned i = offload_global_id_x(); if (i < (unsigned)n) out[i] = table[idx[i]]; }\n\
         OFFLOAD_PARAMS(lookup, int n, const int idx[n], float out[n]);\n\
         OFFLOAD_KERNEL void sum_into(int n, const float *in, float *acc) {\n\
           unsigned i = offload_global_id_x(); if (i < (unsigned)n) acc[i] += in[i]; }\n\
         OFFLOAD_PARAMS(sum_into, int n, const float in[n], float acc[n]);\n",
    );
    let (_rt, device) = host();
    let program = offload_tests::load(&device, &std::fs::read(so).unwrap()).unwrap();
    let lookup = program.kernel("lookup").unwrap();
    let sum_into = program.kernel("sum_into").unwrap();
    let values: Vec<f32> = (0..16).map(|i| i as f32 * 1.5).collect();
    let table = program.global::<f32>("table").unwrap();
    assert_eq!(table.len(), 16);
    assert_eq!(table.to_vec().unwrap(), values);
    let idx = device.upload(&[3i32, 0, 15, 7]).unwrap();
    let mut out = device.alloc::<f32>(4).unwrap();
    lookup
        .launch(LaunchDims::linear(1, 4))
        .arg(4i32)
        .arg(&idx)
        .arg(&mut out)
        .run()
        .unwrap();
    assert_eq!(out.to_vec().unwrap(), [4.5, 0.0, 22.5, 10.5]);
    // Globals are read-only to the safe API (one may be read-only data of the image, as the
    // parameter records are): writes, fills, copies into them and writable kernel arguments
    // are refused; kernels write their own globals by name.
    let ones = device.upload(&[1.0f32; 16]).unwrap();
    let e = sum_into
        .launch(LaunchDims::linear(1, 16))
        .arg(16i32)
        .arg(&ones)
        .arg(program.global::<f32>("table").unwrap())
        .on(&device.queue().unwrap())
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("parameter 2 'acc'"), "{e}");
    let e = program
        .global::<f32>("table")
        .unwrap()
        .fill(0.0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a program's global, which the safe API only reads"),
        "{e}"
    );
    let record = program.global::<u8>("__offload_params_lookup").unwrap();
    assert!(
        record
            .write(b"int n, const int idx[1], float out[1]")
            .is_err()
    );
    assert!(
        record
            .copy_from(&device.upload(&[0u8; 8]).unwrap())
            .is_err()
    );
    assert!(
        device
            .queue()
            .unwrap()
            .upload(record, vec![0u8; 4])
            .is_err()
    );
    let after = program.global::<f32>("table").unwrap().to_vec().unwrap();
    assert_eq!(after, values);
    // Sizes that are not whole elements, and names the image does not have.
    let e = program.global::<f32>("odd").unwrap_err().to_string();
    assert!(e.contains("is 10 bytes, not a whole number of f32"), "{e}");
    assert!(program.global::<f32>("nope").is_err());
    assert_eq!(program.global::<u8>("odd").unwrap().len(), 10);
}

#[test]
fn host_buffers_are_read_in_place_and_written_by_devices_only_exclusively() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    let n = 1000;
    for shared in [false, true] {
        let mut x = if shared {
            device.alloc_shared::<f32>(n).unwrap()
        } else {
            device.alloc_host::<f32>(n).unwrap()
        };
        let mut y = device.alloc_host::<f32>(n).unwrap();
        for (i, v) in x.as_mut_slice().unwrap().iter_mut().enumerate() {
            *v = i as f32;
        }
        y.as_mut_slice().unwrap().fill(1.0);
        // Zero-copy on the host backend: the slice is the device memory.
        assert_eq!(x.as_slice().unwrap().as_ptr() as u64, x.ptr().0);
        saxpy
            .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
            .arg(n as i32)
            .arg(2.0f32)
            .arg(&x)
            .arg(&mut y)
            .run()
            .unwrap();
        let want: Vec<f32> = (0..n).map(|i| 2.0 * i as f32 + 1.0).collect();
        assert_eq!(y.as_slice().unwrap(), &want[..]);
        // Queued work on it: the slice waits for it.
        let queue = device.queue().unwrap();
        saxpy
            .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
            .arg(n as i32)
            .arg(1.0f32)
            .arg(&x)
            .arg(&mut y)
            .on(&queue)
            .run()
            .unwrap();
        let want: Vec<f32> = (0..n).map(|i| 3.0 * i as f32 + 1.0).collect();
        assert_eq!(y.as_slice().unwrap(), &want[..]);
        // Device writes through shared borrows are refused: a slice may be alive.
        let e = saxpy
            .launch(LaunchDims::for_elems(n as u64, 256).unwrap())
            .arg(n as i32)
            .arg(1.0f32)
            .arg(&x)
            .arg(&y)
            .on(&queue)
            .run()
            .unwrap_err()
            .to_string();
        assert!(e.contains("parameter 3 'y'") && e.contains("&mut"), "{e}");
        let e = y.view().write(&[0.0; 4]).unwrap_err().to_string();
        assert!(e.contains("memory the host reads directly"), "{e}");
        let e = queue.upload(&y, vec![0.0; 4]).unwrap_err().to_string();
        assert!(e.contains("memory the host reads directly"), "{e}");
        let e = queue
            .scope(|s| s.write(&y, &[0.0f32; 4]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory the host reads directly"), "{e}");
        // Exclusively, they are allowed.
        queue
            .upload(y.view_mut().slice_mut(..4).unwrap(), vec![9.0; 4])
            .unwrap();
        y.view_mut().slice_mut(4..8).unwrap().fill(8.0).unwrap();
        assert_eq!(
            y.as_slice().unwrap()[..9],
            [9.0, 9.0, 9.0, 9.0, 8.0, 8.0, 8.0, 8.0, want[8]]
        );
        // And it is an end of copies like any buffer.
        let back = device.alloc::<f32>(n).unwrap();
        back.copy_from(&x).unwrap();
        assert_eq!(back.to_vec().unwrap(), x.as_slice().unwrap());
        back.fill(5.0).unwrap();
        y.view_mut().copy_from(&back).unwrap();
        assert!(y.as_slice().unwrap().iter().all(|v| *v == 5.0));
    }
}

#[test]
fn host_memory_a_plugin_cannot_give_is_refused_before_any_slice_exists() {
    // The testdev plugin's memory lives at made-up addresses: its "host" memory is not.
    let rt = offload::Runtime::with_plugin_dirs(&[testdev_plugin_dir()], None);
    let device = rt.device("testdev", 0).unwrap();
    let e = device.alloc_host::<u32>(64).unwrap_err().to_string();
    assert!(
        e.contains("Host memory of testdev:0 is not memory this process can read"),
        "{e}"
    );
}

#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
struct Particle {
    pos: [f32; 3],
    id: u32,
}
offload::device_copy_pod!(Particle);

#[test]
fn pod_structs_cross_to_the_device_without_unsafe() {
    let (_rt, device) = host();
    let ps: Vec<Particle> = (0..100)
        .map(|i| Particle {
            pos: [i as f32, 2.0 * i as f32, -1.0],
            id: i,
        })
        .collect();
    let d = device.upload(&ps).unwrap();
    assert_eq!(d.size(), 100 * 16);
    assert_eq!(d.to_vec().unwrap(), ps);
    d.slice(10..20)
        .unwrap()
        .fill(Particle {
            pos: [0.0; 3],
            id: 7,
        })
        .unwrap();
    assert!(d.to_vec().unwrap()[10..20].iter().all(|p| p.id == 7));
    // A struct's elements are unknown to the checked launch: refused, naming why.
    let program = load(&device, "saxpy");
    let mut dp = device.upload(&ps).unwrap();
    let e = program
        .kernel("saxpy")
        .unwrap()
        .launch(LaunchDims::linear(1, 1))
        .arg(1i32)
        .arg(1.0f32)
        .arg(&d)
        .arg(&mut dp)
        .run()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the launch passes a buffer of") && e.contains("Particle"),
        "{e}"
    );
}

#[test]
fn launches_with_more_arguments_than_stored_inline_keep_every_argument() {
    // args16 takes 16 arguments (more than the builder keeps inline): each reaches the kernel.
    let (_rt, device) = host();
    let program = load(&device, "args16");
    let k = program.kernel("args16").unwrap();
    let n = 8;
    let mut out = device.alloc::<f64>(n).unwrap();
    // SAFETY: args16's arguments are these types in this order (its OFFLOAD_SIGNATURE, which
    // the host plugin checks too), and it writes out[0..n).
    unsafe {
        k.launch(LaunchDims::linear(1, 8))
            .arg(1i32)
            .arg(2i64)
            .arg(3.0f32)
            .arg(4.0f64)
            .arg(5i32)
            .arg(6.0f32)
            .arg(7.0f64)
            .arg(8i64)
            .arg(9.0f32)
            .arg(10.0f64)
            .arg(11i32)
            .arg(12.0f64)
            .arg(13.0f32)
            .arg(14i64)
            .arg(&mut out)
            .arg(n as i32)
            .unchecked()
            .run()
    }
    .unwrap();
    let s: f64 = (1..=14).map(|i| (i * i) as f64).sum();
    let got = out.to_vec().unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, s * (i + 1) as f64, "out[{i}]");
    }
    // The same arguments, some raw in one slice that crosses from the inline ones to the
    // heap block, on a queue, run twice: every argument still reaches the kernel, each time.
    use offload::KernelArg as A;
    let queue = device.queue().unwrap();
    let out2 = device.alloc::<f64>(n).unwrap();
    let mut launch = k.launch(LaunchDims::linear(1, 8));
    launch
        .arg(1i32)
        .arg(2i64)
        .arg(3.0f32)
        .arg(4.0f64)
        .args_raw(&[
            A::I32(5),
            A::F32(6.0),
            A::F64(7.0),
            A::I64(8),
            A::F32(9.0),
            A::F64(10.0),
            A::I32(11),
            A::F64(12.0),
            A::F32(13.0),
            A::I64(14),
            out2.arg(),
        ]);
    launch.arg(n as i32).on(&queue);
    assert!(
        format!("{launch:?}").contains("16 argument(s), on a queue"),
        "{launch:?}"
    );
    for round in 0..2 {
        out2.fill(0.0).unwrap();
        // SAFETY: as above; `out2` holds the n doubles the kernel writes, and lives past the
        // queue's synchronize.
        unsafe { launch.unchecked().run() }.unwrap();
        queue.synchronize().unwrap();
        assert_eq!(out2.to_vec().unwrap(), got, "round {round}");
    }
}

/// A user type whose DeviceCopy impl claims more elements than it holds.
#[derive(Clone, Copy)]
#[repr(C)]
struct Lies(f32);
// SAFETY: plain data (one f32); only its ELEMENT is wrong, on purpose.
unsafe impl offload::DeviceCopy for Lies {
    const ELEMENT: Option<(offload::CType, usize)> = Some((offload::CType::F32, 1000));
}

#[test]
fn an_element_description_that_does_not_add_up_is_ignored_and_host_views_write_exclusively() {
    let (_rt, device) = host();
    let program = load(&device, "saxpy");
    let saxpy = program.kernel("saxpy").unwrap();
    // 4 Lies claim 4000 floats: the check must not believe it.
    let x = device.upload(&[1.0f32; 64]).unwrap();
    let mut lies = device.upload(&[Lies(0.0); 4]).unwrap();
    let e = saxpy
        .launch(LaunchDims::linear(1, 64))
        .arg(64i32)
        .arg(1.0f32)
        .arg(&x)
        .arg(&mut lies)
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("the launch passes a buffer of"), "{e}");
    // A mutable view of a host buffer is a writable argument; a shared one is not.
    let mut hb = device.alloc_host::<f32>(16).unwrap();
    hb.as_mut_slice().unwrap().fill(1.0);
    let x = device.upload(&[2.0f32; 16]).unwrap();
    saxpy
        .launch(LaunchDims::linear(1, 8))
        .arg(8i32)
        .arg(1.0f32)
        .arg(&x)
        .arg(hb.view_mut().slice_mut(8..16).unwrap())
        .run()
        .unwrap();
    assert_eq!(hb.as_slice().unwrap()[6..10], [1.0, 1.0, 3.0, 3.0]);
    let e = saxpy
        .launch(LaunchDims::linear(1, 8))
        .arg(8i32)
        .arg(1.0f32)
        .arg(&x)
        .arg(hb.view().slice(8..16).unwrap())
        .on(&device.queue().unwrap())
        .run()
        .unwrap_err()
        .to_string();
    assert!(e.contains("parameter 3 'y'"), "{e}");
}
