//! Kernel parameter declarations with extents: the text `OFFLOAD_PARAMS(kernel, ...)` of the
//! kernel header records in an image (`__offload_params_<kernel>`), parsed and evaluated.
//!
//! The text is the kernel's own C parameter list, with the extent of each pointer written as
//! a C99 array parameter: `int n, float a, const float x[n], float y[n]`. The header checks at
//! compile time that it matches the kernel's type, so a parse of it says what the kernel
//! takes: the type of each scalar, the element type of each pointer, whether the kernel may
//! write through it (`const` or not) and how many elements it may touch, as an expression of
//! earlier integer parameters (`[n]`, `[nx * ny]`, `[2 * n + 1]`, `[rows][cols]`).
//!
//! Sizes are those of the targets offload runs on (LP64: `long` is 64 bits).

use std::fmt;

/// Prefix of the symbol `OFFLOAD_PARAMS(kernel, ...)` defines.
pub const PARAMS_PREFIX: &str = "__offload_params_";

/// Longest record read (bytes): a parameter list longer than this is not a record.
pub const MAX_PARAMS_TEXT: u64 = 4096;

/// A C arithmetic type a parameter or an element can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CType {
    /// `char` (signedness depends on the target: either 8-bit integer fits).
    Char,
    /// `signed char`, `int8_t`
    I8,
    /// `unsigned char`, `uint8_t`
    U8,
    /// `short`, `int16_t`
    I16,
    /// `unsigned short`, `uint16_t`
    U16,
    /// `int`, `int32_t`
    I32,
    /// `unsigned`, `uint32_t`
    U32,
    /// `long`, `long long`, `int64_t`, `ptrdiff_t`
    I64,
    /// `unsigned long`, `uint64_t`, `size_t`
    U64,
    /// `float`
    F32,
    /// `double`
    F64,
    /// `_Bool`, `bool`
    Bool,
}

impl CType {
    /// Size in bytes.
    pub const fn size(self) -> usize {
        match self {
            CType::Char | CType::I8 | CType::U8 | CType::Bool => 1,
            CType::I16 | CType::U16 => 2,
            CType::I32 | CType::U32 | CType::F32 => 4,
            CType::I64 | CType::U64 | CType::F64 => 8,
        }
    }

    /// Whether it is an integer type (extents may name parameters of these).
    pub fn is_integer(self) -> bool {
        !matches!(self, CType::F32 | CType::F64)
    }

    /// The Rust type that matches it.
    pub fn rust_name(self) -> &'static str {
        match self {
            CType::Char => "i8 or u8",
            CType::I8 => "i8",
            CType::U8 => "u8",
            CType::I16 => "i16",
            CType::U16 => "u16",
            CType::I32 => "i32",
            CType::U32 => "u32",
            CType::I64 => "i64",
            CType::U64 => "u64",
            CType::F32 => "f32",
            CType::F64 => "f64",
            CType::Bool => "bool",
        }
    }

    /// Whether an element of Rust type `other` is a `self` (plain `char` takes either sign).
    pub fn accepts(self, other: CType) -> bool {
        self == other || (self == CType::Char && matches!(other, CType::I8 | CType::U8))
    }
}

/// What a parameter is.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ParamKind {
    /// A value of an arithmetic type.
    Scalar(CType),
    /// A pointer (or an array parameter, which C makes a pointer).
    Pointer(Pointer),
    /// A value offload cannot describe (a struct by value, `long double`, a function pointer):
    /// why, in words.
    Unsupported(String),
}

/// A pointer parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Pointer {
    /// The element type, if it is an arithmetic type (not `void`, a struct or a pointer).
    pub elem: Option<CType>,
    /// The element type as written (`const float`, `struct particle`).
    pub elem_spelling: String,
    /// Whether the kernel may write through it (the elements are not `const`).
    pub writable: bool,
    /// How many elements the kernel may touch, if the declaration says.
    pub extent: Option<Extent>,
}

/// One parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct Param {
    /// Its name, if the declaration gives one.
    pub name: Option<String>,
    /// The declaration as written.
    pub spelling: String,
    /// What it is.
    pub kind: ParamKind,
}

impl Param {
    /// `'y' (float y[n])`, or `argument 2 (float *)` without a name.
    pub fn describe(&self, index: usize) -> String {
        match &self.name {
            Some(n) => format!("parameter {index} '{n}' ({})", self.spelling),
            None => format!("parameter {index} ({})", self.spelling),
        }
    }
}

/// The element count of a pointer parameter: an expression of integer literals and earlier
/// integer parameters with `+`, `-`, `*` and parentheses.
#[derive(Debug, Clone, PartialEq)]
pub struct Extent {
    expr: Expr,
    /// As written (dimensions joined by `*`).
    pub spelling: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Literal(u64),
    Param(usize),
    Add(Box<Expr>, Box<Expr>),
    Sub(Box<Expr>, Box<Expr>),
    Mul(Box<Expr>, Box<Expr>),
}

impl Extent {
    /// The parameter it is, when it is just one (`[n]`): the common case, which a launch
    /// checks without evaluating.
    pub fn as_param(&self) -> Option<usize> {
        match self.expr {
            Expr::Param(i) => Some(i),
            _ => None,
        }
    }

    /// Its value, if it is a literal (`[64]`).
    pub fn as_literal(&self) -> Option<u64> {
        match self.expr {
            Expr::Literal(v) => Some(v),
            _ => None,
        }
    }

    /// The parameters (by index) it reads.
    pub fn params(&self) -> Vec<usize> {
        let mut out = self.reads();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn reads(&self) -> Vec<usize> {
        fn walk(e: &Expr, out: &mut Vec<usize>) {
            match e {
                Expr::Literal(_) => {}
                Expr::Param(i) => out.push(*i),
                Expr::Add(a, b) | Expr::Sub(a, b) | Expr::Mul(a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.expr, &mut out);
        out
    }

    /// The number of elements for the given parameter values; `value(i)` gives parameter
    /// `i`'s value. An error when a value is missing, the arithmetic leaves 128 bits or the
    /// result is negative (a kernel that casts `n` to unsigned, as `i < (unsigned)n` does,
    /// touches a huge range then, not none).
    pub fn eval(&self, value: &dyn Fn(usize) -> Option<i128>) -> Result<u128, String> {
        fn go(e: &Expr, value: &dyn Fn(usize) -> Option<i128>) -> Result<i128, String> {
            let overflow = || "the extent does not fit 128 bits".to_string();
            Ok(match e {
                Expr::Literal(v) => i128::from(*v),
                Expr::Param(i) => value(*i).ok_or_else(|| format!("parameter {i} has no value"))?,
                Expr::Add(a, b) => go(a, value)?
                    .checked_add(go(b, value)?)
                    .ok_or_else(overflow)?,
                Expr::Sub(a, b) => go(a, value)?
                    .checked_sub(go(b, value)?)
                    .ok_or_else(overflow)?,
                Expr::Mul(a, b) => go(a, value)?
                    .checked_mul(go(b, value)?)
                    .ok_or_else(overflow)?,
            })
        }
        // `[n]` and `[64]`, the common extents, without the walk.
        let v = match &self.expr {
            Expr::Param(i) => value(*i).ok_or_else(|| format!("parameter {i} has no value"))?,
            Expr::Literal(v) => i128::from(*v),
            e => go(e, value)?,
        };
        u128::try_from(v).map_err(|_| {
            format!(
                "the extent [{}] is {v} for these arguments; a negative extent is refused",
                self.spelling
            )
        })
    }
}

/// A kernel's parameters, parsed from its `OFFLOAD_PARAMS` text.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelParams {
    /// The text parsed.
    pub text: String,
    /// The parameters, in order.
    pub params: Vec<Param>,
}

impl fmt::Display for KernelParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Number(u64),
    Punct(char),
}

impl fmt::Display for Tok {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "'{s}'"),
            Tok::Number(n) => write!(f, "'{n}'"),
            Tok::Punct(c) => write!(f, "'{c}'"),
        }
    }
}

fn tokenize(text: &str) -> Result<Vec<Tok>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(text[start..i].to_string()));
        } else if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphanumeric() {
                i += 1;
            }
            let lit = &text[start..i];
            let digits = lit.trim_end_matches(['u', 'U', 'l', 'L']);
            let parsed = if let Some(hex) = digits
                .strip_prefix("0x")
                .or_else(|| digits.strip_prefix("0X"))
            {
                u64::from_str_radix(hex, 16)
            } else if digits.len() > 1 && digits.starts_with('0') {
                u64::from_str_radix(&digits[1..], 8)
            } else {
                digits.parse::<u64>()
            };
            out.push(Tok::Number(parsed.map_err(|_| {
                format!("'{lit}' at byte {start} is not an integer literal offload reads")
            })?));
        } else if b"*[](),+-".contains(&c) {
            out.push(Tok::Punct(c as char));
            i += 1;
        } else {
            let ch = text[i..].chars().next().unwrap_or('?');
            return Err(format!(
                "{ch:?} at byte {i} is not part of a parameter declaration offload reads"
            ));
        }
    }
    Ok(out)
}

const QUALIFIERS: &[&str] = &[
    "const",
    "volatile",
    "restrict",
    "__restrict",
    "__restrict__",
];

/// The arithmetic type a list of type specifiers names, if any.
fn arithmetic(words: &[String]) -> Option<CType> {
    let mut w: Vec<&str> = words.iter().map(String::as_str).collect();
    w.sort_unstable();
    Some(match w.as_slice() {
        ["char"] => CType::Char,
        ["char", "signed"] | ["int8_t"] => CType::I8,
        ["char", "unsigned"] | ["uint8_t"] => CType::U8,
        ["short"]
        | ["int", "short"]
        | ["short", "signed"]
        | ["int", "short", "signed"]
        | ["int16_t"] => CType::I16,
        ["short", "unsigned"] | ["int", "short", "unsigned"] | ["uint16_t"] => CType::U16,
        ["int"] | ["signed"] | ["int", "signed"] | ["int32_t"] => CType::I32,
        ["unsigned"] | ["int", "unsigned"] | ["uint32_t"] => CType::U32,
        ["long"]
        | ["int", "long"]
        | ["long", "signed"]
        | ["int", "long", "signed"]
        | ["long", "long"]
        | ["int", "long", "long"]
        | ["long", "long", "signed"]
        | ["int", "long", "long", "signed"]
        | ["int64_t"]
        | ["ptrdiff_t"]
        | ["intptr_t"]
        | ["ssize_t"] => CType::I64,
        ["long", "unsigned"]
        | ["int", "long", "unsigned"]
        | ["long", "long", "unsigned"]
        | ["int", "long", "long", "unsigned"]
        | ["uint64_t"]
        | ["size_t"]
        | ["uintptr_t"] => CType::U64,
        ["float"] => CType::F32,
        ["double"] => CType::F64,
        ["_Bool"] | ["bool"] => CType::Bool,
        _ => return None,
    })
}

const SPECIFIERS: &[&str] = &[
    "void", "char", "short", "int", "long", "float", "double", "signed", "unsigned", "_Bool",
    "bool",
];

struct Parser<'a> {
    toks: &'a [Tok],
    at: usize,
    /// Parentheses open in the extent being read (bounded: the parser recurses on them).
    depth: usize,
}

/// Deepest nesting of parentheses an extent may have.
const MAX_DEPTH: usize = 32;

impl Parser<'_> {
    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.at)
    }
    fn next(&mut self) -> Option<&Tok> {
        let t = self.toks.get(self.at);
        self.at += 1;
        t
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.at += 1;
            true
        } else {
            false
        }
    }
}

/// Tokens as C is usually written: `const float *x`, `y[n * 2 + 1]`.
fn spell(toks: &[Tok]) -> String {
    spell_at(toks, 0)
}

/// [`spell`] of tokens `depth` brackets deep (an extent's: 1).
fn spell_at(toks: &[Tok], mut depth: i32) -> String {
    let word = |t: &Tok| matches!(t, Tok::Ident(_) | Tok::Number(_));
    let mut s = String::new();
    for (i, t) in toks.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| &toks[j]);
        match t {
            Tok::Punct(c @ ('+' | '-' | '*')) if depth > 0 => {
                s.push(' ');
                s.push(*c);
                s.push(' ');
                continue;
            }
            Tok::Punct('*') if prev.is_some_and(word) => s.push(' '),
            Tok::Punct('[') => depth += 1,
            Tok::Punct(']') => depth -= 1,
            Tok::Punct(',') => {
                s.push_str(", ");
                continue;
            }
            _ if word(t) && prev.is_some_and(word) => s.push(' '),
            _ => {}
        }
        match t {
            Tok::Ident(x) => s.push_str(x),
            Tok::Number(n) => s.push_str(&n.to_string()),
            Tok::Punct(c) => s.push(*c),
        }
    }
    s
}

impl KernelParams {
    /// Parses a parameter list (`void` for none). The error names the parameter and the token.
    pub fn parse(text: &str) -> Result<KernelParams, String> {
        let toks = tokenize(text)?;
        if toks.is_empty() {
            return Err(
                "the parameter list is empty (write `void` for a kernel without \
                        parameters)"
                    .into(),
            );
        }
        let mut groups: Vec<&[Tok]> = Vec::new();
        let (mut depth, mut start) = (0i32, 0);
        for (i, t) in toks.iter().enumerate() {
            match t {
                Tok::Punct('[' | '(') => depth += 1,
                Tok::Punct(']' | ')') => depth -= 1,
                Tok::Punct(',') if depth == 0 => {
                    groups.push(&toks[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
            if depth < 0 {
                return Err(format!("unbalanced {t} in the parameter list"));
            }
        }
        groups.push(&toks[start..]);
        if groups.len() == 1 && groups[0] == [Tok::Ident("void".into())] {
            return Ok(KernelParams {
                text: text.to_string(),
                params: Vec::new(),
            });
        }
        let mut params: Vec<Param> = Vec::with_capacity(groups.len());
        for (index, g) in groups.into_iter().enumerate() {
            let p = parse_param(g, &params)
                .map_err(|e| format!("parameter {index} ({}): {e}", spell(g).trim()))?;
            if let Some(name) = &p.name
                && params.iter().any(|q| q.name.as_ref() == Some(name))
            {
                return Err(format!(
                    "parameter {index}: the name '{name}' is used twice"
                ));
            }
            params.push(p);
        }
        Ok(KernelParams {
            text: text.to_string(),
            params,
        })
    }
}

fn parse_param(toks: &[Tok], earlier: &[Param]) -> Result<Param, String> {
    if toks.is_empty() {
        return Err("an empty declaration".into());
    }
    let mut p = Parser {
        toks,
        at: 0,
        depth: 0,
    };
    let mut specifiers: Vec<String> = Vec::new();
    let mut tag: Option<String> = None;
    let mut typedef: Option<String> = None;
    let mut base_const = false;
    // Specifiers and qualifiers of the base type.
    while let Some(Tok::Ident(w)) = p.peek().cloned() {
        if QUALIFIERS.contains(&w.as_str()) {
            base_const |= w == "const";
            p.at += 1;
        } else if SPECIFIERS.contains(&w.as_str()) {
            specifiers.push(w);
            p.at += 1;
        } else if matches!(w.as_str(), "struct" | "union" | "enum") {
            p.at += 1;
            match p.next() {
                Some(Tok::Ident(name)) => tag = Some(format!("{w} {name}")),
                other => return Err(format!("{w} without a name (found {other:?})")),
            }
        } else if specifiers.is_empty() && tag.is_none() && typedef.is_none() {
            typedef = Some(w);
            p.at += 1;
        } else {
            break;
        }
    }
    let base_kinds = usize::from(!specifiers.is_empty()) + usize::from(tag.is_some());
    if base_kinds + usize::from(typedef.is_some()) != 1 {
        return Err("no type, or more than one".into());
    }
    let base: Option<CType> = match (&typedef, &tag) {
        (Some(t), _) => arithmetic(std::slice::from_ref(t)),
        (None, Some(_)) => None,
        (None, None) => arithmetic(&specifiers),
    };
    let is_void = specifiers == ["void"];
    if !specifiers.is_empty() && base.is_none() && !is_void {
        let words = specifiers.join(" ");
        if words.split(' ').filter(|w| *w == "long").count() == 1 && words.contains("double") {
            // `long double`: a scalar offload cannot pass, an element of unknown size.
        } else {
            return Err(format!("'{words}' is not a C type"));
        }
    }
    let base_spelling = {
        let mut s = String::new();
        if base_const {
            s.push_str("const ");
        }
        s.push_str(
            &tag.clone()
                .or(typedef.clone())
                .unwrap_or_else(|| specifiers.join(" ")),
        );
        s
    };
    // Pointers, each with its own qualifiers.
    let mut stars = 0;
    while p.eat('*') {
        stars += 1;
        while let Some(Tok::Ident(w)) = p.peek() {
            if QUALIFIERS.contains(&w.as_str()) {
                p.at += 1;
            } else {
                break;
            }
        }
    }
    if p.peek() == Some(&Tok::Punct('(')) {
        return Err(
            "a function pointer or parenthesised declarator, which offload does not \
                    describe"
                .into(),
        );
    }
    let name = match p.peek() {
        Some(Tok::Ident(n)) => {
            let n = n.clone();
            p.at += 1;
            Some(n)
        }
        _ => None,
    };
    // Array suffixes: `[n]`, `[static n]`, `[]`, `[rows][cols]`.
    let mut dims: Vec<Option<(Expr, String)>> = Vec::new();
    while p.eat('[') {
        while let Some(Tok::Ident(w)) = p.peek() {
            if w == "static" || QUALIFIERS.contains(&w.as_str()) {
                p.at += 1;
            } else {
                break;
            }
        }
        if p.eat(']') {
            dims.push(None);
            continue;
        }
        let from = p.at;
        let e = expr(&mut p, earlier)?;
        let spelling = spell_at(&toks[from..p.at], 1);
        if !p.eat(']') {
            return Err(format!(
                "expected ']' after the extent {spelling}, found {}",
                p.peek().map_or("the end".to_string(), ToString::to_string)
            ));
        }
        dims.push(Some((e, spelling)));
    }
    if let Some(t) = p.peek() {
        return Err(format!("unexpected {t}"));
    }
    let spelling = spell(toks);
    if stars == 0 && dims.is_empty() {
        let kind = match base {
            Some(t) => ParamKind::Scalar(t),
            None if is_void => return Err("a parameter of type void".into()),
            None => ParamKind::Unsupported(format!(
                "'{base_spelling}' by value is not a type offload passes"
            )),
        };
        return Ok(Param {
            name,
            spelling,
            kind,
        });
    }
    if is_void && !dims.is_empty() && stars == 0 {
        return Err("an array of void".into());
    }
    // An array parameter is a pointer to its first element; the extent is the product of
    // its dimensions when every one is given.
    let extent = if dims.is_empty() || dims.iter().any(Option::is_none) {
        if dims.iter().skip(1).any(Option::is_none) {
            return Err("an array dimension other than the first is missing".into());
        }
        None
    } else {
        let mut it = dims.into_iter().flatten();
        let (first, mut spelled) = it.next().expect("dims is not empty");
        let mut e = first;
        for (d, s) in it {
            e = Expr::Mul(Box::new(e), Box::new(d));
            spelled = format!("{spelled} * {s}");
        }
        Some(Extent {
            expr: e,
            spelling: spelled,
        })
    };
    let direct = stars == 0 || (stars == 1 && extent.is_none());
    let pointer = Pointer {
        elem: if direct { base } else { None },
        elem_spelling: if direct {
            base_spelling.clone()
        } else {
            format!("{base_spelling} {}", "*".repeat(stars))
        },
        // Elements of pointer type: whether they are written is not known; say yes.
        writable: !(direct && base_const),
        extent,
    };
    Ok(Param {
        name,
        spelling,
        kind: ParamKind::Pointer(pointer),
    })
}

fn expr(p: &mut Parser<'_>, earlier: &[Param]) -> Result<Expr, String> {
    let mut e = term(p, earlier)?;
    loop {
        if p.eat('+') {
            e = Expr::Add(Box::new(e), Box::new(term(p, earlier)?));
        } else if p.eat('-') {
            e = Expr::Sub(Box::new(e), Box::new(term(p, earlier)?));
        } else {
            return Ok(e);
        }
    }
}

fn term(p: &mut Parser<'_>, earlier: &[Param]) -> Result<Expr, String> {
    let mut e = primary(p, earlier)?;
    while p.eat('*') {
        e = Expr::Mul(Box::new(e), Box::new(primary(p, earlier)?));
    }
    Ok(e)
}

fn primary(p: &mut Parser<'_>, earlier: &[Param]) -> Result<Expr, String> {
    match p.next().cloned() {
        Some(Tok::Number(n)) => Ok(Expr::Literal(n)),
        Some(Tok::Ident(name)) => {
            let found = earlier
                .iter()
                .position(|q| q.name.as_deref() == Some(name.as_str()));
            match found.map(|i| (i, &earlier[i].kind)) {
                Some((i, ParamKind::Scalar(t))) if t.is_integer() => Ok(Expr::Param(i)),
                Some((i, _)) => Err(format!(
                    "the extent names '{name}', parameter {i}, which is not an integer"
                )),
                None => Err(format!(
                    "the extent names '{name}', which is not an earlier parameter"
                )),
            }
        }
        Some(Tok::Punct('(')) => {
            if p.depth >= MAX_DEPTH {
                return Err(format!(
                    "an extent nested more than {MAX_DEPTH} parentheses deep"
                ));
            }
            p.depth += 1;
            let e = expr(p, earlier)?;
            p.depth -= 1;
            if !p.eat(')') {
                return Err("a '(' in an extent without its ')'".into());
            }
            Ok(e)
        }
        Some(t) => Err(format!("unexpected {t} in an extent")),
        None => Err("an extent ends early".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use offload_core::rand::XorShift;

    fn ptr(p: &Param) -> &Pointer {
        match &p.kind {
            ParamKind::Pointer(x) => x,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn saxpy_parses_with_extents_and_constness() {
        let k = KernelParams::parse("int n, float a, const float x[n], float y[n]").unwrap();
        assert_eq!(k.params.len(), 4);
        assert_eq!(k.params[0].kind, ParamKind::Scalar(CType::I32));
        assert_eq!(k.params[1].kind, ParamKind::Scalar(CType::F32));
        let x = ptr(&k.params[2]);
        assert_eq!((x.elem, x.writable), (Some(CType::F32), false));
        assert_eq!(x.extent.as_ref().unwrap().params(), vec![0]);
        let y = ptr(&k.params[3]);
        assert_eq!((y.elem, y.writable), (Some(CType::F32), true));
        let v = |i: usize| (i == 0).then_some(300);
        assert_eq!(y.extent.as_ref().unwrap().eval(&v).unwrap(), 300);
        assert_eq!(k.params[3].describe(3), "parameter 3 'y' (float y[n])");
    }

    #[test]
    fn every_spelling_of_the_types_is_read() {
        let cases = [
            ("unsigned n", ParamKind::Scalar(CType::U32)),
            ("unsigned int n", ParamKind::Scalar(CType::U32)),
            ("long long n", ParamKind::Scalar(CType::I64)),
            ("unsigned long n", ParamKind::Scalar(CType::U64)),
            ("size_t n", ParamKind::Scalar(CType::U64)),
            ("int64_t n", ParamKind::Scalar(CType::I64)),
            ("double d", ParamKind::Scalar(CType::F64)),
            ("short s", ParamKind::Scalar(CType::I16)),
            ("const int c", ParamKind::Scalar(CType::I32)),
            ("int", ParamKind::Scalar(CType::I32)),
        ];
        for (text, want) in cases {
            let k = KernelParams::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(k.params[0].kind, want, "{text}");
        }
        let k = KernelParams::parse("struct particle *p, void *raw, float **pp, long double ld")
            .unwrap();
        assert_eq!(ptr(&k.params[0]).elem, None);
        assert_eq!(ptr(&k.params[0]).elem_spelling, "struct particle");
        assert_eq!(ptr(&k.params[1]).elem, None);
        assert!(ptr(&k.params[2]).writable);
        assert!(matches!(k.params[3].kind, ParamKind::Unsupported(_)));
        assert!(KernelParams::parse("void").unwrap().params.is_empty());
    }

    #[test]
    fn qualifiers_decide_what_is_written() {
        let k = KernelParams::parse(
            "float const *a, float *const b, const float *restrict c, volatile int *d, \
             const float e[static 4]",
        )
        .unwrap();
        let w: Vec<bool> = k.params.iter().map(|p| ptr(p).writable).collect();
        assert_eq!(w, [false, true, false, true, false]);
        assert_eq!(ptr(&k.params[4]).extent.as_ref().unwrap().spelling, "4");
    }

    #[test]
    fn extents_are_expressions_of_earlier_integers() {
        let k = KernelParams::parse(
            "int nx, int ny, unsigned k, const double a[ny][nx], double b[(nx + 2) * (ny + 2)], \
             float c[2 * k - 1], float d[0x10], float e[010]",
        )
        .unwrap();
        let vals = [7i128, 5, 3];
        let v = |i: usize| vals.get(i).copied();
        let ext = |i: usize| ptr(&k.params[i]).extent.as_ref().unwrap().eval(&v).unwrap();
        assert_eq!(ext(3), 35);
        assert_eq!(ext(4), 63);
        assert_eq!(ext(5), 5);
        assert_eq!(ext(6), 16);
        assert_eq!(ext(7), 8);
        // A negative count is refused: a kernel may compare against it as unsigned.
        let neg = |i: usize| [7, 5, -4].get(i).copied();
        let e = ptr(&k.params[5])
            .extent
            .as_ref()
            .unwrap()
            .eval(&neg)
            .unwrap_err();
        assert!(e.contains("[2 * k - 1] is -9"), "{e}");
        assert!(ptr(&k.params[3]).extent.as_ref().unwrap().eval(&v).is_ok());
        let k = KernelParams::parse("const float x[]").unwrap();
        assert_eq!(ptr(&k.params[0]).extent, None);
    }

    #[test]
    fn bad_lists_name_the_parameter_and_the_token() {
        for (text, want) in [
            ("", "empty"),
            (
                "float x[n], int n",
                "parameter 0 (float x[n]): the extent names 'n', which is not an earlier parameter",
            ),
            (
                "float a, float x[a]",
                "'a', parameter 0, which is not an integer",
            ),
            ("int n, float x[n", "expected ']'"),
            ("int n, float x[n]]", "unbalanced"),
            ("int n, int n", "used twice"),
            ("int n, float x[n / 2]", "'/' at byte"),
            ("void (*f)(int)", "function pointer"),
            (
                "int n, float x[99999999999999999999999]",
                "not an integer literal",
            ),
            ("unsigned float x", "is not a C type"),
            ("void v", "type void"),
            ("int, ", "empty declaration"),
            (
                &format!("int n, float x[{}n{}]", "(".repeat(5000), ")".repeat(5000)),
                "nested more than 32 parentheses deep",
            ),
            ("int long float", "is not a C type"),
        ] {
            let e = KernelParams::parse(text).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn generated_lists_parse_back_to_what_was_written() {
        // Random declarations from known pieces: the parse gives back each piece's meaning.
        let scalars = [
            ("int", CType::I32),
            ("unsigned", CType::U32),
            ("long", CType::I64),
            ("size_t", CType::U64),
            ("float", CType::F32),
            ("double", CType::F64),
        ];
        let mut rng = XorShift(0x9a7a_11e5);
        for round in 0..500 {
            let count = 1 + (rng.next_u64() % 8) as usize;
            let mut text = Vec::new();
            let mut want = Vec::new();
            let mut ints: Vec<(String, i128)> = Vec::new();
            for i in 0..count {
                let (spelling, t) = scalars[(rng.next_u64() % scalars.len() as u64) as usize];
                let name = format!("p{i}");
                if rng.next_u64() % 2 == 0 || ints.is_empty() {
                    text.push(format!("{spelling} {name}"));
                    if t.is_integer() {
                        ints.push((name, (rng.next_u64() % 1000) as i128));
                    }
                    want.push((ParamKind::Scalar(t), None));
                } else {
                    let konst = rng.next_u64() % 2 == 0;
                    let (a, va) = ints[(rng.next_u64() % ints.len() as u64) as usize].clone();
                    let lit = rng.next_u64() % 9;
                    text.push(format!(
                        "{}{spelling} {name}[{a} * {lit} + 1]",
                        if konst { "const " } else { "" }
                    ));
                    want.push((
                        ParamKind::Scalar(t), // element type, checked below
                        Some((konst, va * lit as i128 + 1)),
                    ));
                }
            }
            let joined = text.join(", ");
            let k = KernelParams::parse(&joined).unwrap_or_else(|e| panic!("{joined}: {e}"));
            assert_eq!(k.params.len(), count, "round {round}: {joined}");
            let value = |i: usize| {
                let n = k.params[i].name.as_ref()?;
                ints.iter().find(|(m, _)| m == n).map(|(_, v)| *v)
            };
            for (p, (kind, ptr_want)) in k.params.iter().zip(&want) {
                match ptr_want {
                    None => assert_eq!(&p.kind, kind, "{joined}"),
                    Some((konst, count)) => {
                        let x = ptr(p);
                        let &ParamKind::Scalar(t) = kind else {
                            unreachable!()
                        };
                        assert_eq!(x.elem, Some(t), "{joined}");
                        assert_eq!(x.writable, !konst, "{joined}");
                        let got = x.extent.as_ref().unwrap().eval(&value).unwrap();
                        assert_eq!(got as i128, *count, "{joined}");
                    }
                }
            }
        }
    }

    #[test]
    fn mutated_lists_never_panic() {
        let seed =
            "int n, unsigned m, const float x[n * m + 2], double y[(n - 1) * 3], struct s *q";
        let mut rng = XorShift(0x5eed_9a7a);
        let alphabet = b"intfloa[]()*+-,0123 xyz_cv";
        for _ in 0..3000 {
            let mut b = seed.as_bytes().to_vec();
            for _ in 0..1 + rng.next_u64() % 4 {
                let at = (rng.next_u64() % b.len() as u64) as usize;
                match rng.next_u64() % 3 {
                    0 => b[at] = alphabet[(rng.next_u64() % alphabet.len() as u64) as usize],
                    1 => {
                        b.remove(at);
                    }
                    _ => b.insert(
                        at,
                        alphabet[(rng.next_u64() % alphabet.len() as u64) as usize],
                    ),
                }
                if b.is_empty() {
                    break;
                }
            }
            let text = String::from_utf8_lossy(&b);
            if let Ok(k) = KernelParams::parse(&text) {
                for p in &k.params {
                    if let ParamKind::Pointer(Pointer {
                        extent: Some(e), ..
                    }) = &p.kind
                    {
                        let _ = e.eval(&|_| Some(i64::MAX as i128));
                    }
                }
            }
        }
    }
}
