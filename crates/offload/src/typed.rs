//! Kernels with their parameter types in Rust: `program.kernel("saxpy")?.typed::<(i32, f32,
//! In<f32>, Out<f32>)>()?` checks once that the kernel's `OFFLOAD_PARAMS` record has these
//! types, and then `saxpy.launch(dims, (n, 2.0, &x, &mut y)).run()` is type-checked by the
//! compiler: a buffer where the kernel takes an `int`, an `f64` buffer where it takes `float *`,
//! or a shared borrow where it writes, do not compile. A buffer parameter takes a whole buffer or a
//! range of one (`x.slice(..n)`, `y.slice_mut(n..)`: [`ParamValue`]). Each launch still checks
//! the extents (`float y[n]`) against the buffers or ranges, as [`crate::Launch::run`] does.

use crate::Kernel;
use crate::buffer::{BufferView, BufferViewMut, DeviceBuffer, DeviceCopy, HostBuffer};
use crate::launch::Launch;
use crate::params::{CType, ParamKind};
use offload_core::{Error, LaunchDims, Result};
use std::marker::PhantomData;

/// A pointer parameter the kernel only reads (`const T *`, `const T x[n]`): passed as
/// `&DeviceBuffer<T>`, a range of one (`BufferView<T>`: `x.slice(a..b)`) or `&HostBuffer<T>`.
#[derive(Debug)]
pub struct In<T>(PhantomData<T>);

/// A pointer parameter the kernel writes (`T *`, `T y[n]`): passed as `&mut DeviceBuffer<T>`,
/// an exclusive range of one (`BufferViewMut<T>`: `y.slice_mut(a..b)`) or `&mut HostBuffer<T>`.
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
    #[doc(hidden)]
    fn expect() -> Expect;
}

/// What a launch may pass for a parameter of type `P`: the scalar itself; for [`In<T>`]
/// `&DeviceBuffer<T>`, `BufferView<T>` or `&HostBuffer<T>`; for [`Out<T>`] `&mut
/// DeviceBuffer<T>`, `BufferViewMut<T>` or `&mut HostBuffer<T>`. Sealed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed for a typed kernel's parameter of type `{P}`",
    label = "a kernel parameter of type `{P}`",
    note = "a scalar takes its own type; In<T> takes &DeviceBuffer<T>, BufferView<T> or \
            &HostBuffer<T>; Out<T> (which the kernel writes) takes &mut DeviceBuffer<T>, \
            BufferViewMut<T> or &mut HostBuffer<T>"
)]
pub trait ParamValue<'a, P: ParamType>: sealed::Value<P> {
    #[doc(hidden)]
    fn push(self, l: &mut Launch<'_, 'a>);
}

mod sealed {
    pub trait Sealed {}
    pub trait Value<P> {}
}

macro_rules! scalar_param {
    ($($t:ty => $c:ident),*) => { $(
        impl sealed::Sealed for $t {}
        impl ParamType for $t {
            fn expect() -> Expect {
                Expect::Scalar(CType::$c)
            }
        }
        impl sealed::Value<$t> for $t {}
        impl<'a> ParamValue<'a, $t> for $t {
            fn push(self, l: &mut Launch<'_, 'a>) {
                l.arg(self);
            }
        }
    )* };
}

/// The values a buffer parameter takes: `$param<T>` from each `$value`.
macro_rules! buffer_values {
    ($param:ident: $($value:ty),*) => { $(
        impl<'a, T: DeviceCopy> sealed::Value<$param<T>> for $value {}
        impl<'a, T: DeviceCopy> ParamValue<'a, $param<T>> for $value {
            fn push(self, l: &mut Launch<'_, 'a>) {
                l.arg(self);
            }
        }
    )* };
}
scalar_param!(i32 => I32, u32 => U32, i64 => I64, u64 => U64, f32 => F32, f64 => F64);

impl<T: DeviceCopy> sealed::Sealed for In<T> {}
impl<T: DeviceCopy> ParamType for In<T> {
    fn expect() -> Expect {
        Expect::Pointer {
            element: crate::buffer::element_of::<T>(),
            type_name: std::any::type_name::<T>(),
            written: false,
        }
    }
}
buffer_values!(In: &'a DeviceBuffer<T>, BufferView<'a, T>, &'a HostBuffer<T>);

impl<T: DeviceCopy> sealed::Sealed for Out<T> {}
impl<T: DeviceCopy> ParamType for Out<T> {
    fn expect() -> Expect {
        Expect::Pointer {
            element: crate::buffer::element_of::<T>(),
            type_name: std::any::type_name::<T>(),
            written: true,
        }
    }
}
buffer_values!(Out: &'a mut DeviceBuffer<T>, BufferViewMut<'a, T>, &'a mut HostBuffer<T>);

/// A tuple of [`ParamType`]s: a typed kernel's parameter list (up to 12). Sealed.
pub trait ParamTypes: sealed::Sealed {
    #[doc(hidden)]
    fn expects() -> Vec<Expect>;
}

/// The tuple a launch of a kernel typed `P` passes: a [`ParamValue`] for each parameter.
/// Sealed.
pub trait ParamValues<'a, P: ParamTypes>: sealed::Value<P> {
    #[doc(hidden)]
    fn push(self, l: &mut Launch<'_, 'a>);
}

macro_rules! params_tuple {
    ($($p:ident $x:ident $v:ident),*) => {
        impl<$($p: ParamType),*> sealed::Sealed for ($($p,)*) {}
        impl<$($p: ParamType),*> ParamTypes for ($($p,)*) {
            fn expects() -> Vec<Expect> {
                vec![$($p::expect()),*]
            }
        }
        impl<$($p: ParamType, $x: sealed::Value<$p>),*> sealed::Value<($($p,)*)>
            for ($($x,)*) {}
        impl<'a, $($p: ParamType, $x: ParamValue<'a, $p>),*> ParamValues<'a, ($($p,)*)>
            for ($($x,)*)
        {
            #[allow(
                unused_variables,
                clippy::unused_unit,
                reason = "the expansion for no parameters binds nothing from `()`"
            )]
            fn push(self, l: &mut Launch<'_, 'a>) {
                let ($($v,)*) = self;
                $($v.push(l);)*
            }
        }
    };
}
params_tuple!();
params_tuple!(A XA a);
params_tuple!(A XA a, B XB b);
params_tuple!(A XA a, B XB b, C XC c);
params_tuple!(A XA a, B XB b, C XC c, D XD d);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f, G XG g);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f, G XG g, H XH h);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f, G XG g, H XH h, I XI i);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f, G XG g, H XH h, I XI i, J XJ j);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f, G XG g, H XH h, I XI i, J XJ j, K XK k);
params_tuple!(A XA a, B XB b, C XC c, D XD d, E XE e, F XF f, G XG g, H XH h, I XI i, J XJ j, K XK k, L XL l);

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

    /// A launch of it with these arguments: [`crate::Launch::run`] it (checked: the extents
    /// against the buffers), after [`crate::Launch::on`] a queue to enqueue it.
    #[inline]
    pub fn launch<'k, 'a>(
        &'k self,
        dims: LaunchDims,
        args: impl ParamValues<'a, P>,
    ) -> Launch<'k, 'a> {
        let mut launch = self.kernel.launch(dims);
        args.push(&mut launch);
        launch
    }
}
