//! How a generated message delimits its body, for both differential suites: `Content-Length`
//! in one of a suite's forms, `Transfer-Encoding` with a chunked body whose size lines take odd
//! forms, both at once, or neither; written out as framing fields and body bytes. Each suite
//! keeps its own tables and weights (what is odd differs for requests and for responses); the
//! shapes, the strategy and the writing are here once.

use std::fmt::Debug;

use proptest::prelude::*;

/// How one chunk's size line is written.
#[derive(Debug, Clone, Copy)]
pub enum ChunkForm {
    Lower,
    Upper,
    LeadingZeros,
    Extension,
    SpaceThenExtension,
    Prefix0x,
    Negative,
    TooManyDigits,
    OneMore,
    /// The size line and the data end in a bare LF.
    BareLf,
}

impl ChunkForm {
    /// Every form, in declaration order (the order of [`chunk_forms`]' weights).
    pub const ALL: [ChunkForm; 10] = [
        ChunkForm::Lower,
        ChunkForm::Upper,
        ChunkForm::LeadingZeros,
        ChunkForm::Extension,
        ChunkForm::SpaceThenExtension,
        ChunkForm::Prefix0x,
        ChunkForm::Negative,
        ChunkForm::TooManyDigits,
        ChunkForm::OneMore,
        ChunkForm::BareLf,
    ];

    /// The size line of an `n`-byte chunk, and the line ending after it and after the data.
    pub fn size_line(self, n: usize) -> (String, &'static [u8]) {
        let crlf: &'static [u8] = b"\r\n";
        match self {
            ChunkForm::Lower => (format!("{n:x}"), crlf),
            ChunkForm::Upper => (format!("{n:X}"), crlf),
            ChunkForm::LeadingZeros => (format!("000{n:x}"), crlf),
            ChunkForm::Extension => (format!("{n:x};a=b"), crlf),
            ChunkForm::SpaceThenExtension => (format!("{n:x} ;a=\"b c\""), crlf),
            ChunkForm::Prefix0x => (format!("0x{n:x}"), crlf),
            ChunkForm::Negative => (format!("-{n:x}"), crlf),
            ChunkForm::TooManyDigits => (format!("1000000000000000{n:x}"), crlf),
            ChunkForm::OneMore => (format!("{:x}", n + 1), crlf),
            ChunkForm::BareLf => (format!("{n:x}"), b"\n"),
        }
    }
}

/// Lists of `len` chunk forms, each drawn with `weights` (one per form of [`ChunkForm::ALL`];
/// 0 leaves a form out).
pub fn chunk_forms(
    weights: [u32; 10],
    len: std::ops::Range<usize>,
) -> impl Strategy<Value = Vec<ChunkForm>> {
    let options: Vec<(u32, Just<ChunkForm>)> = ChunkForm::ALL
        .into_iter()
        .zip(weights)
        .filter(|(_, w)| *w > 0)
        .map(|(f, w)| (w, Just(f)))
        .collect();
    prop::collection::vec(proptest::strategy::Union::new_weighted(options), len)
}

/// A chunked body: `body` cut into `forms.len()` chunks, each size line in its form, then
/// `last` (the last chunk and the trailer section, as written).
pub fn chunked_body(body: &[u8], forms: &[ChunkForm], last: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let per = body.len().div_ceil(forms.len().max(1)).max(1);
    for (piece, form) in body.chunks(per).zip(forms) {
        let (size, eol) = form.size_line(piece.len());
        out.extend_from_slice(size.as_bytes());
        out.extend_from_slice(eol);
        out.extend_from_slice(piece);
        out.extend_from_slice(eol);
    }
    out.extend_from_slice(last);
    out
}

/// How a message frames its body. `L` picks the last chunk from the suite's table.
#[derive(Debug, Clone)]
pub enum Framing<L> {
    /// No framing field.
    None,
    /// `Content-Length` in one of the suite's forms.
    Length(u8),
    /// A `Transfer-Encoding` value (an index into the suite's table) with a chunked body.
    Chunked(u8, Vec<ChunkForm>, L),
    /// Both: `Transfer-Encoding` and a `Content-Length` form.
    Both(u8, u8, Vec<ChunkForm>, L),
}

/// Framings drawn with `weights` for None, Length, Chunked and Both, `te_values` being the
/// length of the suite's `Transfer-Encoding` table and `forms` the suite's chunk forms.
pub fn framing<L, F>(
    te_values: usize,
    weights: [u32; 4],
    forms: fn() -> F,
) -> BoxedStrategy<Framing<L>>
where
    L: Arbitrary + Clone + Debug + 'static,
    F: Strategy<Value = Vec<ChunkForm>> + 'static,
{
    let te = 0..te_values as u8;
    let [none, length, chunked, both] = weights;
    prop_oneof![
        none => Just(Framing::None),
        length => any::<u8>().prop_map(Framing::Length),
        chunked => (te.clone(), forms(), any::<L>()).prop_map(|(t, f, l)| Framing::Chunked(t, f, l)),
        both => (te, any::<u8>(), forms(), any::<L>()).prop_map(|(t, c, f, l)| Framing::Both(t, c, f, l)),
    ]
    .boxed()
}

/// A suite's tables: its `Transfer-Encoding` values (each entry one or more fields), its
/// `Content-Length` forms for an `n`-byte body, and its last chunks.
pub struct Tables<L> {
    pub te_values: &'static [&'static [&'static str]],
    pub cl_value: fn(u8, usize) -> Vec<String>,
    pub last_chunk: fn(L) -> &'static [u8],
}

impl<L: Copy> Framing<L> {
    /// The framing fields (`Transfer-Encoding` first, then `Content-Length`) and the body as
    /// sent; with no framing, `unframed` is the body.
    pub fn render(&self, body: &[u8], unframed: &[u8], t: &Tables<L>) -> (Vec<String>, Vec<u8>) {
        let te_fields = |te: u8| {
            t.te_values[te as usize % t.te_values.len()]
                .iter()
                .map(|v| format!("Transfer-Encoding: {v}"))
        };
        let cl_fields = |form: u8, n: usize| {
            (t.cl_value)(form, n)
                .into_iter()
                .map(|v| format!("Content-Length: {v}"))
        };
        match self {
            Framing::None => (Vec::new(), unframed.to_vec()),
            Framing::Length(form) => (cl_fields(*form, body.len()).collect(), body.to_vec()),
            Framing::Chunked(te, forms, last) => (
                te_fields(*te).collect(),
                chunked_body(body, forms, (t.last_chunk)(*last)),
            ),
            Framing::Both(te, cl, forms, last) => {
                let body = chunked_body(body, forms, (t.last_chunk)(*last));
                let fields = te_fields(*te).chain(cl_fields(*cl, body.len())).collect();
                (fields, body)
            }
        }
    }
}
