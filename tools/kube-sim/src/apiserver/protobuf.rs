//! Kubernetes protobuf request bodies (`application/vnd.kubernetes.protobuf`).
//!
//! The apiserver accepts built-in objects in the Kubernetes protobuf
//! encoding: the 4-byte magic `k8s\0`, then a `runtime.Unknown` message
//! (`typeMeta` = 1 {`apiVersion` = 1, `kind` = 2}, `raw` = 2,
//! `contentEncoding` = 3, `contentType` = 4) whose `raw` field is the object
//! encoded per the `generated.proto` of `k8s.io/api` and
//! `k8s.io/apimachinery`. client-go's typed clients use it whenever their
//! config says so — Helm's release storage does, for its Secrets.
//!
//! kube-sim keeps objects as JSON, so this module decodes such a body into
//! the same JSON the object would have had (Go's `omitempty` rules
//! included). A small hand-written wire reader (varints, length-delimited
//! fields, map entries) walks static message schemas; only the kinds listed
//! in [`schema_for`] are decodable. Responses are always JSON.

use base64::Engine;
use serde_json::{Map, Value, json};

/// The media type of Kubernetes protobuf.
pub const MEDIA_TYPE: &str = "application/vnd.kubernetes.protobuf";

/// The prefix of every Kubernetes protobuf body.
pub const MAGIC: &[u8; 4] = b"k8s\0";

/// Why a body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    /// The body does not start with [`MAGIC`].
    NotMarked,
    /// The envelope names a kind kube-sim has no protobuf schema for.
    UnknownKind { api_version: String, kind: String },
    /// The envelope is not `raw` protobuf (e.g. a `contentEncoding`).
    UnsupportedEncoding(String),
    /// Broken wire data.
    Malformed(String),
}

impl std::fmt::Display for ProtoError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotMarked => write!(
                f,
                "provided data does not appear to be a protobuf message, expected prefix {:?}",
                "k8s\u{0}"
            ),
            Self::UnknownKind { api_version, kind } => {
                write!(f, "no protobuf schema for kind {kind:?} in {api_version:?}")
            }
            Self::UnsupportedEncoding(e) => write!(f, "unsupported content encoding {e:?}"),
            Self::Malformed(m) => f.write_str(m),
        }
    }
}

/// The decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Envelope {
    pub api_version: String,
    pub kind: String,
    pub raw: Vec<u8>,
    pub content_encoding: String,
    pub content_type: String,
}

// ---------------------------------------------------------------------------
// Wire reader.

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const START_GROUP: u8 = 3;
const END_GROUP: u8 = 4;
const FIXED32: u8 = 5;

fn malformed(what: &str) -> ProtoError {
    ProtoError::Malformed(what.to_string())
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| malformed("unexpected EOF"))?;
            self.pos += 1;
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed("proto: integer overflow"))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| malformed("unexpected EOF"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn len_delimited(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = usize::try_from(self.varint()?).map_err(|_| malformed("proto: bad length"))?;
        self.take(n)
    }

    /// The next field's number and wire type.
    fn key(&mut self) -> Result<(u32, u8), ProtoError> {
        let k = self.varint()?;
        let field = u32::try_from(k >> 3).map_err(|_| malformed("proto: bad field number"))?;
        if field == 0 {
            return Err(malformed("proto: illegal tag 0"));
        }
        Ok((field, (k & 7) as u8))
    }

    /// Skips a field of an unknown number, as generated code does.
    fn skip(&mut self, field: u32, wire: u8) -> Result<(), ProtoError> {
        match wire {
            VARINT => self.varint().map(drop),
            FIXED64 => self.take(8).map(drop),
            LEN => self.len_delimited().map(drop),
            FIXED32 => self.take(4).map(drop),
            START_GROUP => loop {
                let (f, w) = self.key()?;
                if w == END_GROUP {
                    return if f == field {
                        Ok(())
                    } else {
                        Err(malformed("proto: mismatched end group"))
                    };
                }
                self.skip(f, w)?;
            },
            _ => Err(malformed(&format!("proto: illegal wireType {wire}"))),
        }
    }
}

/// Splits a body into its envelope.
pub fn decode_envelope(body: &[u8]) -> Result<Envelope, ProtoError> {
    let rest = body.strip_prefix(MAGIC).ok_or(ProtoError::NotMarked)?;
    let mut env = Envelope::default();
    let mut r = Reader::new(rest);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, LEN) => {
                let mut tm = Reader::new(r.len_delimited()?);
                while !tm.done() {
                    match tm.key()? {
                        (1, LEN) => env.api_version = utf8(tm.len_delimited()?)?,
                        (2, LEN) => env.kind = utf8(tm.len_delimited()?)?,
                        (f, w) => tm.skip(f, w)?,
                    }
                }
            }
            (2, LEN) => env.raw = r.len_delimited()?.to_vec(),
            (3, LEN) => env.content_encoding = utf8(r.len_delimited()?)?,
            (4, LEN) => env.content_type = utf8(r.len_delimited()?)?,
            (f, w) => r.skip(f, w)?,
        }
    }
    Ok(env)
}

fn utf8(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|_| malformed("proto: invalid UTF-8 in string field"))
}

// ---------------------------------------------------------------------------
// Schemas.

/// How a field is encoded and rendered to JSON.
#[derive(Debug, Clone, Copy)]
enum Ty {
    Str,
    Int64,
    Bool,
    Msg(&'static [Field]),
    /// `metav1.Time`: seconds only, RFC 3339 in UTC; empty = zero time.
    Time,
    /// `metav1.FieldsV1`: its `Raw` bytes are JSON.
    FieldsV1,
    MapStr,
    /// `map<string, bytes>`, values rendered as base64 like Go's `[]byte`.
    MapBytes,
}

#[derive(Debug, Clone, Copy)]
struct Field {
    num: u32,
    name: &'static str,
    ty: Ty,
    repeated: bool,
    /// Go's `omitempty` on a non-pointer field: a zero value is dropped.
    /// `false` for pointer fields (`*bool`, `*int64`, …), whose presence is
    /// meaningful, and for fields without `omitempty`.
    omit_zero: bool,
}

const fn f(num: u32, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: false,
        omit_zero: true,
    }
}

/// A pointer field (`*bool`, `*int64`, `*string`, `*T`) or one without
/// `omitempty`: kept whenever it is on the wire.
const fn p(num: u32, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: false,
        omit_zero: false,
    }
}

const fn rep(num: u32, name: &'static str, ty: Ty) -> Field {
    Field {
        num,
        name,
        ty,
        repeated: true,
        omit_zero: true,
    }
}

// k8s.io/apimachinery/pkg/apis/meta/v1/generated.proto
const OWNER_REFERENCE: &[Field] = &[
    p(5, "apiVersion", Ty::Str),
    p(1, "kind", Ty::Str),
    p(3, "name", Ty::Str),
    p(4, "uid", Ty::Str),
    p(6, "controller", Ty::Bool),
    p(7, "blockOwnerDeletion", Ty::Bool),
];

const MANAGED_FIELDS_ENTRY: &[Field] = &[
    f(1, "manager", Ty::Str),
    f(2, "operation", Ty::Str),
    f(3, "apiVersion", Ty::Str),
    p(4, "time", Ty::Time),
    f(6, "fieldsType", Ty::Str),
    p(7, "fieldsV1", Ty::FieldsV1),
    f(8, "subresource", Ty::Str),
];

const OBJECT_META: &[Field] = &[
    f(1, "name", Ty::Str),
    f(2, "generateName", Ty::Str),
    f(3, "namespace", Ty::Str),
    f(4, "selfLink", Ty::Str),
    f(5, "uid", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "generation", Ty::Int64),
    f(8, "creationTimestamp", Ty::Time),
    p(9, "deletionTimestamp", Ty::Time),
    p(10, "deletionGracePeriodSeconds", Ty::Int64),
    f(11, "labels", Ty::MapStr),
    f(12, "annotations", Ty::MapStr),
    rep(13, "ownerReferences", Ty::Msg(OWNER_REFERENCE)),
    rep(14, "finalizers", Ty::Str),
    rep(17, "managedFields", Ty::Msg(MANAGED_FIELDS_ENTRY)),
];

const PRECONDITIONS: &[Field] = &[p(1, "uid", Ty::Str), p(2, "resourceVersion", Ty::Str)];

const DELETE_OPTIONS: &[Field] = &[
    p(1, "gracePeriodSeconds", Ty::Int64),
    p(2, "preconditions", Ty::Msg(PRECONDITIONS)),
    p(3, "orphanDependents", Ty::Bool),
    p(4, "propagationPolicy", Ty::Str),
    rep(5, "dryRun", Ty::Str),
    p(
        6,
        "ignoreStoreReadErrorWithClusterBreakingPotential",
        Ty::Bool,
    ),
];

// k8s.io/api/core/v1/generated.proto
const SECRET: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    p(5, "immutable", Ty::Bool),
    f(2, "data", Ty::MapBytes),
    f(4, "stringData", Ty::MapStr),
    f(3, "type", Ty::Str),
];

const CONFIG_MAP: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    p(4, "immutable", Ty::Bool),
    f(2, "data", Ty::MapStr),
    f(3, "binaryData", Ty::MapBytes),
];

const NAMESPACE_CONDITION: &[Field] = &[
    p(1, "type", Ty::Str),
    p(2, "status", Ty::Str),
    f(4, "lastTransitionTime", Ty::Time),
    f(5, "reason", Ty::Str),
    f(6, "message", Ty::Str),
];

const NAMESPACE_SPEC: &[Field] = &[rep(1, "finalizers", Ty::Str)];

const NAMESPACE_STATUS: &[Field] = &[
    f(1, "phase", Ty::Str),
    rep(2, "conditions", Ty::Msg(NAMESPACE_CONDITION)),
];

const NAMESPACE: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    f(2, "spec", Ty::Msg(NAMESPACE_SPEC)),
    f(3, "status", Ty::Msg(NAMESPACE_STATUS)),
];

const OBJECT_REFERENCE: &[Field] = &[
    f(1, "kind", Ty::Str),
    f(2, "namespace", Ty::Str),
    f(3, "name", Ty::Str),
    f(4, "uid", Ty::Str),
    f(5, "apiVersion", Ty::Str),
    f(6, "resourceVersion", Ty::Str),
    f(7, "fieldPath", Ty::Str),
];

const LOCAL_OBJECT_REFERENCE: &[Field] = &[f(1, "name", Ty::Str)];

const SERVICE_ACCOUNT: &[Field] = &[
    f(1, "metadata", Ty::Msg(OBJECT_META)),
    rep(2, "secrets", Ty::Msg(OBJECT_REFERENCE)),
    rep(3, "imagePullSecrets", Ty::Msg(LOCAL_OBJECT_REFERENCE)),
    p(4, "automountServiceAccountToken", Ty::Bool),
];

/// The kinds kube-sim decodes from protobuf, by envelope `apiVersion` and
/// `kind`. Object kinds are `core/v1`; `DeleteOptions` is registered in
/// every group version (and `meta.k8s.io/v1`).
fn schema_for(api_version: &str, kind: &str) -> Option<&'static [Field]> {
    match (api_version, kind) {
        ("v1", "Secret") => Some(SECRET),
        ("v1", "ConfigMap") => Some(CONFIG_MAP),
        ("v1", "Namespace") => Some(NAMESPACE),
        ("v1", "ServiceAccount") => Some(SERVICE_ACCOUNT),
        (_, "DeleteOptions") => Some(DELETE_OPTIONS),
        _ => None,
    }
}

/// Whether kube-sim accepts protobuf bodies for objects of this built-in
/// kind (`group` is empty for the core group).
pub fn decodes_kind(group: &str, kind: &str) -> bool {
    group.is_empty() && kind != "DeleteOptions" && schema_for("v1", kind).is_some()
}

// ---------------------------------------------------------------------------
// Decoding.

/// Decodes a Kubernetes protobuf body into the JSON object it encodes, with
/// `apiVersion` and `kind` from the envelope.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let env = decode_envelope(body)?;
    if !env.content_encoding.is_empty() {
        return Err(ProtoError::UnsupportedEncoding(env.content_encoding));
    }
    let schema =
        schema_for(&env.api_version, &env.kind).ok_or_else(|| ProtoError::UnknownKind {
            api_version: env.api_version.clone(),
            kind: env.kind.clone(),
        })?;
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), json!(env.api_version));
    obj.insert("kind".into(), json!(env.kind));
    if let Value::Object(fields) = message(schema, &env.raw)? {
        obj.extend(fields);
    }
    Ok(Value::Object(obj))
}

fn message(schema: &[Field], buf: &[u8]) -> Result<Value, ProtoError> {
    let mut out = Map::new();
    let mut r = Reader::new(buf);
    while !r.done() {
        let (num, wire) = r.key()?;
        let Some(field) = schema.iter().find(|x| x.num == num) else {
            r.skip(num, wire)?;
            continue;
        };
        match field.ty {
            Ty::MapStr | Ty::MapBytes => {
                if wire != LEN {
                    return Err(wrong_wire(field, wire));
                }
                let (k, v) = map_entry(field.ty, r.len_delimited()?)?;
                let m = out.entry(field.name).or_insert_with(|| json!({}));
                if let Value::Object(m) = m {
                    m.insert(k, v);
                }
            }
            _ if field.repeated => {
                let list = out.entry(field.name).or_insert_with(|| json!([]));
                let Value::Array(list) = list else {
                    continue;
                };
                if wire == LEN && is_varint_type(field.ty) {
                    // A packed repeated scalar.
                    let mut packed = Reader::new(r.len_delimited()?);
                    while !packed.done() {
                        list.push(scalar(field, &mut packed, VARINT)?);
                    }
                } else {
                    list.push(scalar(field, &mut r, wire)?);
                }
            }
            _ => {
                let v = scalar(field, &mut r, wire)?;
                // Last one wins, as in protobuf; nested messages would be
                // merged, which no client relies on for these kinds.
                out.insert(field.name.to_string(), v);
            }
        }
    }
    // Go's omitempty: drop zero values of non-pointer fields.
    out.retain(|name, v| {
        let Some(field) = schema.iter().find(|x| x.name == name) else {
            return true;
        };
        !(field.omit_zero && is_zero(v))
    });
    // An empty `metav1.Time` is the zero time, which JSON omits.
    out.retain(|_, v| !v.is_null());
    Ok(Value::Object(out))
}

fn is_varint_type(ty: Ty) -> bool {
    matches!(ty, Ty::Int64 | Ty::Bool)
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_i64() == Some(0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(_) => false,
    }
}

fn wrong_wire(field: &Field, wire: u8) -> ProtoError {
    ProtoError::Malformed(format!(
        "proto: wrong wireType = {wire} for field {}",
        field.name
    ))
}

fn scalar(field: &Field, r: &mut Reader<'_>, wire: u8) -> Result<Value, ProtoError> {
    let need = if is_varint_type(field.ty) {
        VARINT
    } else {
        LEN
    };
    if wire != need {
        return Err(wrong_wire(field, wire));
    }
    Ok(match field.ty {
        Ty::Str => json!(utf8(r.len_delimited()?)?),
        Ty::Int64 => json!(r.varint()? as i64),
        Ty::Bool => json!(r.varint()? != 0),
        Ty::Msg(schema) => message(schema, r.len_delimited()?)?,
        Ty::Time => time(r.len_delimited()?)?,
        Ty::FieldsV1 => fields_v1(r.len_delimited()?)?,
        Ty::MapStr | Ty::MapBytes => unreachable!("maps are handled by the caller"),
    })
}

/// A map entry: a message with `key` = 1 and `value` = 2.
fn map_entry(ty: Ty, buf: &[u8]) -> Result<(String, Value), ProtoError> {
    let mut r = Reader::new(buf);
    let mut key = String::new();
    let mut value = json!("");
    while !r.done() {
        match r.key()? {
            (1, LEN) => key = utf8(r.len_delimited()?)?,
            (2, LEN) => {
                let b = r.len_delimited()?;
                value = match ty {
                    Ty::MapBytes => json!(base64::engine::general_purpose::STANDARD.encode(b)),
                    _ => json!(utf8(b)?),
                };
            }
            (f, w) => r.skip(f, w)?,
        }
    }
    Ok((key, value))
}

/// `metav1.Time`: an empty message is the zero time (omitted); otherwise
/// `seconds` as RFC 3339 UTC — the apiserver drops `nanos`.
fn time(buf: &[u8]) -> Result<Value, ProtoError> {
    if buf.is_empty() {
        return Ok(Value::Null);
    }
    let mut r = Reader::new(buf);
    let mut seconds = 0i64;
    while !r.done() {
        match r.key()? {
            (1, VARINT) => seconds = r.varint()? as i64,
            (f, w) => r.skip(f, w)?,
        }
    }
    let t = time::OffsetDateTime::from_unix_timestamp(seconds)
        .map_err(|_| malformed("proto: timestamp out of range"))?;
    Ok(Value::String(crate::meta::format_timestamp(t)))
}

/// `metav1.FieldsV1{Raw = 1}`: the raw bytes are a JSON document.
fn fields_v1(buf: &[u8]) -> Result<Value, ProtoError> {
    let mut r = Reader::new(buf);
    let mut raw: &[u8] = b"{}";
    while !r.done() {
        match r.key()? {
            (1, LEN) => raw = r.len_delimited()?,
            (f, w) => r.skip(f, w)?,
        }
    }
    serde_json::from_slice(raw).map_err(|e| ProtoError::Malformed(format!("FieldsV1: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    // A minimal encoder to build test bodies by hand.
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    fn key(field: u32, wire: u8, out: &mut Vec<u8>) {
        varint((u64::from(field) << 3) | u64::from(wire), out);
    }

    fn bytes_field(field: u32, b: &[u8], out: &mut Vec<u8>) {
        key(field, LEN, out);
        varint(b.len() as u64, out);
        out.extend_from_slice(b);
    }

    fn str_field(field: u32, s: &str, out: &mut Vec<u8>) {
        bytes_field(field, s.as_bytes(), out);
    }

    fn varint_field(field: u32, v: u64, out: &mut Vec<u8>) {
        key(field, VARINT, out);
        varint(v, out);
    }

    fn entry(field: u32, k: &str, v: &[u8], out: &mut Vec<u8>) {
        let mut e = Vec::new();
        str_field(1, k, &mut e);
        bytes_field(2, v, &mut e);
        bytes_field(field, &e, out);
    }

    fn envelope(api_version: &str, kind: &str, raw: &[u8]) -> Vec<u8> {
        let mut tm = Vec::new();
        str_field(1, api_version, &mut tm);
        str_field(2, kind, &mut tm);
        let mut out = MAGIC.to_vec();
        bytes_field(1, &tm, &mut out);
        bytes_field(2, raw, &mut out);
        str_field(3, "", &mut out);
        str_field(4, "", &mut out);
        out
    }

    /// ObjectMeta the way Go's generated marshaller writes it: every
    /// non-pointer string present even when empty, a zero creation time as
    /// an empty message.
    fn meta(name: &str, ns: &str, labels: &[(&str, &str)]) -> Vec<u8> {
        let mut m = Vec::new();
        str_field(1, name, &mut m);
        str_field(2, "", &mut m);
        str_field(3, ns, &mut m);
        str_field(4, "", &mut m);
        str_field(5, "", &mut m);
        str_field(6, "", &mut m);
        varint_field(7, 0, &mut m);
        bytes_field(8, &[], &mut m);
        for (k, v) in labels {
            entry(11, k, v.as_bytes(), &mut m);
        }
        m
    }

    #[test]
    fn varints_decode_across_byte_boundaries_and_negative_numbers() {
        for v in [0u64, 1, 127, 128, 300, 1 << 35, u64::MAX] {
            let mut b = Vec::new();
            varint(v, &mut b);
            assert_eq!(Reader::new(&b).varint().unwrap(), v);
        }
        let mut b = Vec::new();
        varint(-5i64 as u64, &mut b);
        assert_eq!(b.len(), 10);
        assert_eq!(Reader::new(&b).varint().unwrap() as i64, -5);
        assert!(Reader::new(&[0x80, 0x80]).varint().is_err());
    }

    #[test]
    fn a_helm_release_secret_decodes_to_its_json() {
        let mut raw = Vec::new();
        bytes_field(
            1,
            &meta(
                "sh.helm.release.v1.smoke.v1",
                "",
                &[("owner", "helm"), ("name", "smoke"), ("version", "1")],
            ),
            &mut raw,
        );
        entry(2, "release", b"H4sI\x00\xff", &mut raw);
        str_field(3, "helm.sh/release.v1", &mut raw);
        let obj = decode(&envelope("v1", "Secret", &raw)).unwrap();
        assert_eq!(
            obj,
            json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": "sh.helm.release.v1.smoke.v1",
                    "labels": {"owner": "helm", "name": "smoke", "version": "1"}
                },
                "data": {"release": "SDRzSQD/"},
                "type": "helm.sh/release.v1"
            })
        );
    }

    #[test]
    fn pointer_fields_keep_false_and_zero_and_times_render_in_utc() {
        let mut m = meta("c", "ns", &[]);
        let mut t = Vec::new();
        varint_field(1, 1_700_000_000, &mut t);
        varint_field(2, 123, &mut t);
        bytes_field(9, &t, &mut m);
        varint_field(10, 0, &mut m);
        str_field(14, "kubernetes.io/x", &mut m);
        str_field(14, "y", &mut m);
        let mut owner = Vec::new();
        str_field(1, "Deployment", &mut owner);
        str_field(3, "d", &mut owner);
        str_field(4, "uid-1", &mut owner);
        str_field(5, "apps/v1", &mut owner);
        varint_field(6, 1, &mut owner);
        bytes_field(13, &owner, &mut m);
        let mut raw = Vec::new();
        bytes_field(1, &m, &mut raw);
        varint_field(4, 0, &mut raw); // immutable: false
        entry(2, "k", b"v", &mut raw);
        entry(3, "bin", &[0, 1, 2], &mut raw);
        let obj = decode(&envelope("v1", "ConfigMap", &raw)).unwrap();
        assert_eq!(obj["immutable"], json!(false));
        assert_eq!(obj["data"], json!({"k": "v"}));
        assert_eq!(obj["binaryData"], json!({"bin": "AAEC"}));
        let md = &obj["metadata"];
        assert_eq!(md["deletionTimestamp"], json!("2023-11-14T22:13:20Z"));
        assert_eq!(md["deletionGracePeriodSeconds"], json!(0));
        assert_eq!(md["finalizers"], json!(["kubernetes.io/x", "y"]));
        assert_eq!(
            md["ownerReferences"],
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": "d", "uid": "uid-1", "controller": true}])
        );
        assert!(md.get("creationTimestamp").is_none());
        assert!(md.get("generation").is_none());
    }

    #[test]
    fn namespaces_and_service_accounts_decode() {
        let mut raw = Vec::new();
        bytes_field(1, &meta("smoke-ns", "", &[]), &mut raw);
        let mut spec = Vec::new();
        str_field(1, "kubernetes", &mut spec);
        bytes_field(2, &spec, &mut raw);
        bytes_field(3, &[], &mut raw);
        let ns = decode(&envelope("v1", "Namespace", &raw)).unwrap();
        assert_eq!(
            ns,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "smoke-ns"},
                   "spec": {"finalizers": ["kubernetes"]}, "status": {}})
        );

        let mut raw = Vec::new();
        bytes_field(1, &meta("sa", "telo-runner", &[]), &mut raw);
        let mut pull = Vec::new();
        str_field(1, "regcred", &mut pull);
        bytes_field(3, &pull, &mut raw);
        varint_field(4, 0, &mut raw);
        let sa = decode(&envelope("v1", "ServiceAccount", &raw)).unwrap();
        assert_eq!(
            sa,
            json!({"apiVersion": "v1", "kind": "ServiceAccount",
                   "metadata": {"name": "sa", "namespace": "telo-runner"},
                   "imagePullSecrets": [{"name": "regcred"}],
                   "automountServiceAccountToken": false})
        );
    }

    #[test]
    fn delete_options_decode_with_preconditions() {
        let mut raw = Vec::new();
        varint_field(1, 0, &mut raw);
        let mut pre = Vec::new();
        str_field(1, "u-1", &mut pre);
        bytes_field(2, &pre, &mut raw);
        str_field(4, "Background", &mut raw);
        str_field(5, "All", &mut raw);
        let opts = decode(&envelope("v1", "DeleteOptions", &raw)).unwrap();
        assert_eq!(
            opts,
            json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                   "preconditions": {"uid": "u-1"}, "propagationPolicy": "Background",
                   "dryRun": ["All"]})
        );
    }

    #[test]
    fn unknown_fields_of_every_wire_type_are_skipped() {
        let mut raw = Vec::new();
        varint_field(99, 7, &mut raw);
        key(98, FIXED64, &mut raw);
        raw.extend_from_slice(&[0; 8]);
        key(97, FIXED32, &mut raw);
        raw.extend_from_slice(&[0; 4]);
        str_field(96, "ignored", &mut raw);
        key(95, START_GROUP, &mut raw);
        varint_field(1, 1, &mut raw);
        key(95, END_GROUP, &mut raw);
        str_field(3, "Opaque", &mut raw);
        let obj = decode(&envelope("v1", "Secret", &raw)).unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque"})
        );
    }

    #[test]
    fn bad_bodies_are_reported() {
        assert_eq!(decode(b"{\"kind\":\"Secret\"}"), Err(ProtoError::NotMarked));
        assert_eq!(
            decode(&envelope("apps/v1", "Deployment", &[])),
            Err(ProtoError::UnknownKind {
                api_version: "apps/v1".into(),
                kind: "Deployment".into()
            })
        );
        let mut truncated = envelope("v1", "Secret", &[]);
        truncated.extend_from_slice(&[0x12, 0x05, b'a']);
        assert!(matches!(decode(&truncated), Err(ProtoError::Malformed(_))));
        let mut wrong = Vec::new();
        varint_field(1, 3, &mut wrong); // metadata as a varint
        assert!(matches!(
            decode(&envelope("v1", "Secret", &wrong)),
            Err(ProtoError::Malformed(_))
        ));
        let mut gz = MAGIC.to_vec();
        str_field(3, "gzip", &mut gz);
        assert_eq!(
            decode(&gz),
            Err(ProtoError::UnsupportedEncoding("gzip".into()))
        );
    }

    #[test]
    fn only_core_kinds_with_a_schema_are_decodable() {
        assert!(decodes_kind("", "Secret"));
        assert!(decodes_kind("", "ConfigMap"));
        assert!(!decodes_kind("", "Pod"));
        assert!(!decodes_kind("apps", "Secret"));
        assert!(!decodes_kind("", "DeleteOptions"));
    }
}
