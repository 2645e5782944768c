//! Kernels with their parameter types in Rust: `program.kernel("saxpy")?.typed::<(i32, f32,
//! In<f32>, Out<f32>)>()?` checks once that the kernel's `OFFLOAD_PARAMS` record has these
//! types, and then `saxpy.launch(dims, (n, 2.0, &x, &mut y))` is type-checked by the compiler:
//! a buffer where the kernel takes an `int`, an `f64` buffer where it takes `float *`, or a
//! shared borrow where it writes, do not compile. Each launch still checks the extents
//! (`float y[n]`) against the buffers, as [`crate::Launch::run`] does.

use crate::Kernel;
use crate::LaunchQueue;
use crate::buffer::{DeviceBuffer, DeviceCopy};
use crate::launch::Launch;
use crate::params::{CType, ParamKind};
use offload_core::{Error, LaunchDims, Result};
use std::marker::PhantomData;

/// A pointer parameter the kernel only reads (`const T *`, `const T x[n]`): passed as
/// `&DeviceBuffer<T>`.
#[derive(Debug)]
pub struct In<T>(PhantomData<T>);

/// A pointer parameter the kernel writes (`T *`, `T y[n]`): passed as `&mut DeviceBuffer<T>`.
#[derive(Debug)]
pub struct Out<T>(PhantomData<T>);

/// What a typed parameter expects of the kernel's record.
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    Scalar(CType),
    Pointer {
        element: Option<(CType, usize)>,
        type_name: &'static str,
        written: bool,
    },
}

/// One parameter type of a typed kernel: `i32`, `u32`, `i64`, `u64`, `f32`, `f64`, [`In`],
/// [`Out`]. Sealed.
pub trait ParamType: sealed::Sealed {
    /// What a launch passes for it.
    type Value<'a>;
    #[doc(hidden)]
    fn expect() -> Expect;
    #[doc(hidden)]
    fn push<'a>(v: Self::Value<'a>, l: &mut Launch<'_, 'a>);
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! scalar_param {
    ($($t:ty => $c:ident),*) => { $(
        impl sealed::Sealed for $t {}
        impl ParamType for $t {
            type Value<'a> = $t;
            fn expect() -> Expect {
                Expect::Scalar(CType::$c)
            }
            fn push<'a>(v: $t, l: &mut Launch<'_, 'a>) {
                l.arg(v);
            }
        }
    )* };
}
scalar_param!(i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

impl<T: DeviceCopy> sealed::Sealed for In<T> {}
impl<T: DeviceCopy> ParamType for In<T> {
    type Value<'a> = &'a DeviceBuffer<T>;
    fn expect() -> Expect {
        Expect::Pointer {
            element: crate::buffer::element_of::<T>(),
            type_name: std::any::type_name::<T>(),
            written: false,
        }
    }
    fn push<'a>(v: &'a DeviceBuffer<T>, l: &mut Launch<'_, 'a>) {
        l.arg(v);
    }
}

impl<T: DeviceCopy> sealed::Sealed for Out<T> {}
impl<T: DeviceCopy> ParamType for Out<T> {
    type Value<'a> = &'a mut DeviceBuffer<T>;
    fn expect() -> Expect {
        Expect::Pointer {
            element: crate::buffer::element_of::<T>(),
            type_name: std::any::type_name::<T>(),
            written: true,
        }
    }
    fn push<'a>(v: &'a mut DeviceBuffer<T>, l: &mut Launch<'_, 'a>) {
        l.arg(v);
    }
}

/// A tuple of [`ParamType`]s: a typed kernel's parameter list (up to 12). Sealed.
pub trait ParamTypes: sealed::Sealed {
    /// The tuple a launch passes.
    type Values<'a>;
    #[doc(hidden)]
    fn expects() -> Vec<Expect>;
    #[doc(hidden)]
    fn push<'a>(v: Self::Values<'a>, l: &mut Launch<'_, 'a>);
}

macro_rules! params_tuple {
    ($($p:ident $v:ident),*) => {
        impl<$($p: ParamType),*> sealed::Sealed for ($($p,)*) {}
        impl<$($p: ParamType),*> ParamTypes for ($($p,)*) {
            type Values<'a> = ($($p::Value<'a>,)*);
            fn expects() -> Vec<Expect> {
                vec![$($p::expect()),*]
            }
            #[allow(
                unused_variables,
                clippy::unused_unit,
                reason = "the expansion for no parameters binds nothing from `()`"
            )]
            fn push<'a>(v: Self::Values<'a>, l: &mut Launch<'_, 'a>) {
                let ($($v,)*) = v;
                $($p::push($v, l);)*
            }
        }
    };
}
params_tuple!();
params_tuple!(A a);
params_tuple!(A a, B b);
params_tuple!(A a, B b, C c);
params_tuple!(A a, B b, C c, D d);
params_tuple!(A a, B b, C c, D d, E e);
params_tuple!(A a, B b, C c, D d, E e, F f);
params_tuple!(A a, B b, C c, D d, E e, F f, G g);
params_tuple!(A a, B b, C c, D d, E e, F f, G g, H h);
params_tuple!(A a, B b, C c, D d, E e, F f, G g, H h, I i);
params_tuple!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j);
params_tuple!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k);
params_tuple!(A a, B b, C c, D d, E e, F f, G g, H h, I i, J j, K k, L l);

/// A kernel whose parameter types the compiler knows ([`Kernel::typed`]).
pub struct TypedKernel<P: ParamTypes> {
    kernel: Kernel,
    _p: PhantomData<fn(P)>,
}

impl<P: ParamTypes> std::fmt::Debug for TypedKernel<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} as {}", self.kernel, std::any::type_name::<P>())
    }
}

impl<P: ParamTypes> Clone for TypedKernel<P> {
    fn clone(&self) -> Self {
        TypedKernel {
            kernel: self.kernel.clone(),
            _p: PhantomData,
        }
    }
}

impl Kernel {
    /// This kernel with its parameter types in Rust (a tuple of [`ParamType`]s). An error, naming
    /// the parameter, when the kernel's `OFFLOAD_PARAMS` record says otherwise (or it has
    /// none).
    pub fn typed<P: ParamTypes>(self) -> Result<TypedKernel<P>> {
        let name = self.name().to_string();
        let refuse = |what: String| Err(Error::InvalidArgument(format!("kernel '{name}': {what}")));
        let params = match self.params() {
            None => {
                return refuse(
                    "its image has no OFFLOAD_PARAMS record, so its types cannot be checked".into(),
                );
            }
            Some(Err(e)) => return refuse(format!("its OFFLOAD_PARAMS record is unusable: {e}")),
            Some(Ok(p)) => p,
        };
        let want = P::expects();
        if want.len() != params.params.len() {
            return refuse(format!(
                "it takes {} argument(s) ({}); the Rust type has {}",
                params.params.len(),
                params.text,
                want.len()
            ));
        }
        for (i, (param, want)) in params.params.iter().zip(&want).enumerate() {
            let what = param.describe(i);
            match (&param.kind, want) {
                (ParamKind::Scalar(t), Expect::Scalar(w)) if t.accepts(*w) => {}
                (
                    ParamKind::Pointer(p),
                    Expect::Pointer {
                        element,
                        type_name,
                        written,
                    },
                ) => {
                    if p.writable && !written {
                        return refuse(format!(
                            "{what}: the kernel may write through it: Out<{type_name}>, not In"
                        ));
                    }
                    match (p.elem, element) {
                        (Some(c), Some((r, _))) if c.accepts(*r) => {}
                        _ => {
                            return refuse(format!(
                                "{what}: its elements are {}; the Rust type says {type_name}",
                                p.elem_spelling
                            ));
                        }
                    }
                }
                (_, w) => {
                    return refuse(format!("{what}; the Rust type says {w:?}"));
                }
            }
        }
        Ok(TypedKernel {
            kernel: self,
            _p: PhantomData,
        })
    }
}

impl<P: ParamTypes> TypedKernel<P> {
    /// The kernel.
    pub fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// Launches it with these arguments and waits for it; the extents are checked against
    /// the buffers first ([`crate::Launch::run`]).
    pub fn launch(&self, dims: LaunchDims, args: P::Values<'_>) -> Result<()> {
        let mut launch = self.kernel.launch(dims);
        P::push(args, &mut launch);
        launch.run()
    }

    /// Enqueues it on `queue` ([`crate::Launch::run_on`]).
    pub fn launch_on<'a, Q: LaunchQueue<'a>>(
        &self,
        queue: Q,
        dims: LaunchDims,
        args: P::Values<'a>,
    ) -> Result<()> {
        let mut launch = self.kernel.launch(dims);
        P::push(args, &mut launch);
        launch.run_on(queue)
    }
}
