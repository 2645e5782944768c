//! The little JSON the profile writer needs (strings, numbers, objects, arrays), so the
//! library does not depend on a serialisation framework.

use std::fmt::Write;

/// A JSON value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Str(String),
    Int(i128),
    Float(f64),
    Obj(Vec<(String, Json)>),
    Arr(Vec<Json>),
}

impl From<&str> for Json {
    fn from(s: &str) -> Json {
        Json::Str(s.to_string())
    }
}
impl From<String> for Json {
    fn from(s: String) -> Json {
        Json::Str(s)
    }
}
impl From<f64> for Json {
    fn from(v: f64) -> Json {
        Json::Float(v)
    }
}
macro_rules! json_int {
    ($($t:ty),*) => { $( impl From<$t> for Json { fn from(v: $t) -> Json { Json::Int(v as i128) } } )* };
}
json_int!(i32, u32, u64, i64, usize);
impl<T: Copy + Into<Json>> From<&T> for Json {
    fn from(v: &T) -> Json {
        (*v).into()
    }
}
impl From<Vec<Json>> for Json {
    fn from(v: Vec<Json>) -> Json {
        Json::Arr(v)
    }
}

/// `obj!{ "key" => value, ... }`: a JSON object, keys in the order written.
macro_rules! obj {
    ($($k:literal => $v:expr),* $(,)?) => {
        $crate::json::Json::Obj(vec![$(($k.to_string(), $crate::json::Json::from($v))),*])
    };
}
pub(crate) use obj;

impl Json {
    /// The compact text.
    pub(crate) fn to_text(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Str(s) => write_str(s, out),
            Json::Int(v) => {
                let _ = write!(out, "{v}");
            }
            // JSON has no NaN or infinity.
            Json::Float(v) if !v.is_finite() => out.push_str("null"),
            Json::Float(v) => {
                let _ = write!(out, "{v}");
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_str(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
            Json::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    v.write(out);
                }
                out.push(']');
            }
        }
    }
}

fn write_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_written_as_json() {
        let v = obj! {
            "s" => "a \"q\" \\ \n\u{1}é",
            "i" => 42u64,
            "f" => 1.5f64,
            "nan" => f64::NAN,
            "big" => 1e21f64,
            "a" => vec![Json::from(1u32), obj! {}],
        };
        assert_eq!(
            v.to_text(),
            r#"{"s":"a \"q\" \\ \n\u0001é","i":42,"f":1.5,"nan":null,"big":1000000000000000000000,"a":[1,{}]}"#
        );
    }
}
