//! Launch arguments against a kernel's parameters.

use offload_core::jit::ParamType;
use offload_core::{Error, KernelArg, Result};

/// Refuses a launch whose arguments do not match the kernel's parameters: calling a function
/// with the wrong arguments is undefined behaviour, a wrong result at best.
pub fn check(name: &str, params: &[ParamType], args: &[KernelArg]) -> Result<()> {
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    if params.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' takes {} argument(s) ({}); the launch passes {} ({})",
            params.len(),
            list(params.iter().map(ToString::to_string).collect()),
            args.len(),
            list(args.iter().map(|a| a.type_name().to_string()).collect()),
        )));
    }
    for (i, (p, a)) in params.iter().zip(args).enumerate() {
        let fits = matches!(
            (p, a),
            (ParamType::I32, KernelArg::I32(_) | KernelArg::U32(_))
                | (ParamType::I64, KernelArg::I64(_) | KernelArg::U64(_))
                | (ParamType::F32, KernelArg::F32(_))
                | (ParamType::F64, KernelArg::F64(_))
                | (ParamType::Ptr, KernelArg::Ptr(_))
                | (ParamType::Ptr | ParamType::I64, KernelArg::Word(_))
        );
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' argument {i} is {p} in the kernel; the launch passes {}",
                a.type_name()
            )));
        }
    }
    Ok(())
}

/// Refuses a launch whose arguments do not have the sizes a driver reports for the kernel's
/// parameters (`sizes`, in bytes): the driver reads that many bytes for each.
pub fn check_sizes(name: &str, sizes: &[usize], args: &[KernelArg]) -> Result<()> {
    if sizes.len() != args.len() {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' takes {} argument(s) (of {} bytes); the launch passes {}",
            sizes.len(),
            if sizes.is_empty() {
                "no".to_string()
            } else {
                sizes
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            args.len()
        )));
    }
    for (i, (size, arg)) in sizes.iter().zip(args).enumerate() {
        if *size != arg.size() {
            return Err(Error::InvalidArgument(format!(
                "kernel '{name}' argument {i} is {size} bytes in the kernel; the launch passes {} \
                 ({} bytes)",
                arg.type_name(),
                arg.size()
            )));
        }
    }
    Ok(())
}

/// Refuses a block larger than the kernel itself allows (`limit` threads, as its code was
/// compiled for: `source` names where the number comes from), with both numbers.
pub fn check_block(name: &str, block: [u32; 3], limit: u32, source: &str) -> Result<()> {
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    if threads > u64::from(limit) {
        return Err(Error::InvalidArgument(format!(
            "kernel '{name}' runs at most {limit} threads per block ({source}); the launch asks \
             for {}x{}x{} = {threads}",
            block[0], block[1], block[2]
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload_core::DevicePtr;

    #[test]
    fn arguments_are_checked_against_the_kernel_signature() {
        let params = [
            ParamType::I32,
            ParamType::F32,
            ParamType::Ptr,
            ParamType::Ptr,
        ];
        let ptr = KernelArg::Ptr(DevicePtr(64));
        let good = [KernelArg::U32(1), KernelArg::F32(2.0), ptr, ptr];
        check("saxpy", &params, &good).unwrap();
        let e = check("saxpy", &params, &good[..3]).unwrap_err().to_string();
        assert!(
            e.contains(
                "takes 4 argument(s) (i32, float, ptr, ptr); the launch passes 3 (u32, f32, ptr)"
            ),
            "{e}"
        );
        let e = check(
            "saxpy",
            &params,
            &[KernelArg::I32(1), KernelArg::F64(2.0), ptr, ptr],
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("argument 1 is float in the kernel; the launch passes f64"),
            "{e}"
        );
        assert!(check("k", &[ParamType::Other("i16".into())], &[KernelArg::I32(1)]).is_err());
        check("empty", &[], &[]).unwrap();
    }

    #[test]
    fn a_word_is_a_pointer_or_a_64_bit_integer_and_nothing_else() {
        let w = KernelArg::Word(0x1000);
        check("omp", &[ParamType::Ptr, ParamType::I64], &[w, w]).unwrap();
        for p in [ParamType::I32, ParamType::F32, ParamType::F64] {
            let e = check("omp", std::slice::from_ref(&p), &[w])
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!(
                    "argument 0 is {p} in the kernel; the launch passes word"
                )),
                "{e}"
            );
        }
    }
}
