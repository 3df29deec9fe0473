//! Label and field selectors: parsing the query-string syntax the apiserver
//! accepts and matching objects against it.

use serde_json::Value;

use crate::kinds::{FieldSet, ResourceInfo};
use crate::meta;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    GreaterThan(i64),
    LessThan(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct LabelRequirement {
    key: String,
    op: LabelOp,
}

/// A parsed `labelSelector`. Empty matches everything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let mut lexer = Lexer::new(text);
        let mut requirements = Vec::new();
        loop {
            match lexer.peek() {
                Token::End => break,
                _ => requirements.push(parse_requirement(&mut lexer)?),
            }
            match lexer.next() {
                Token::End => break,
                Token::Comma => {
                    if lexer.peek() == Token::End {
                        return Err(SelectorError(
                            "unable to parse requirement: found '', expected: identifier".into(),
                        ));
                    }
                }
                other => {
                    return Err(SelectorError(format!(
                        "found '{}', expected: ',' or 'end of string'",
                        other.text()
                    )));
                }
            }
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = meta::labels(obj);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|r| {
            let v = get(&r.key);
            match &r.op {
                LabelOp::Exists => v.is_some(),
                LabelOp::DoesNotExist => v.is_none(),
                LabelOp::Equals(x) => v == Some(x.as_str()),
                LabelOp::NotEquals(x) => v != Some(x.as_str()),
                LabelOp::In(xs) => v.is_some_and(|v| xs.iter().any(|x| x == v)),
                LabelOp::NotIn(xs) => v.is_none_or(|v| !xs.iter().any(|x| x == v)),
                LabelOp::GreaterThan(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                LabelOp::LessThan(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }

    /// Label matching against a plain map (`spec.selector` of a Service,
    /// `matchLabels` of a namespace selector).
    pub fn from_match_labels(labels: &serde_json::Map<String, Value>) -> Self {
        let requirements = labels
            .iter()
            .filter_map(|(k, v)| {
                v.as_str().map(|v| LabelRequirement {
                    key: k.clone(),
                    op: LabelOp::Equals(v.to_string()),
                })
            })
            .collect();
        Self { requirements }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Not,
    Eq,
    DoubleEq,
    NotEq,
    Gt,
    Lt,
    Comma,
    Open,
    Close,
    In,
    NotIn,
    End,
}

impl Token {
    fn text(&self) -> String {
        match self {
            Token::Ident(s) => s.clone(),
            Token::Not => "!".into(),
            Token::Eq => "=".into(),
            Token::DoubleEq => "==".into(),
            Token::NotEq => "!=".into(),
            Token::Gt => ">".into(),
            Token::Lt => "<".into(),
            Token::Comma => ",".into(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::End => String::new(),
        }
    }
}

struct Lexer {
    tokens: Vec<Token>,
    pos: usize,
}

impl Lexer {
    fn new(text: &str) -> Self {
        let chars: Vec<char> = text.chars().collect();
        let mut tokens = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            match c {
                ' ' | '\t' => i += 1,
                ',' => {
                    tokens.push(Token::Comma);
                    i += 1
                }
                '(' => {
                    tokens.push(Token::Open);
                    i += 1
                }
                ')' => {
                    tokens.push(Token::Close);
                    i += 1
                }
                '>' => {
                    tokens.push(Token::Gt);
                    i += 1
                }
                '<' => {
                    tokens.push(Token::Lt);
                    i += 1
                }
                '!' => {
                    if chars.get(i + 1) == Some(&'=') {
                        tokens.push(Token::NotEq);
                        i += 2
                    } else {
                        tokens.push(Token::Not);
                        i += 1
                    }
                }
                '=' => {
                    if chars.get(i + 1) == Some(&'=') {
                        tokens.push(Token::DoubleEq);
                        i += 2
                    } else {
                        tokens.push(Token::Eq);
                        i += 1
                    }
                }
                _ => {
                    let start = i;
                    while i < chars.len() && !" \t,()!=<>".contains(chars[i]) {
                        i += 1;
                    }
                    let word: String = chars[start..i].iter().collect();
                    tokens.push(match word.as_str() {
                        "in" => Token::In,
                        "notin" => Token::NotIn,
                        _ => Token::Ident(word),
                    });
                }
            }
        }
        Self { tokens, pos: 0 }
    }

    fn peek(&self) -> Token {
        self.tokens.get(self.pos).cloned().unwrap_or(Token::End)
    }

    fn next(&mut self) -> Token {
        let t = self.peek();
        self.pos += 1;
        t
    }
}

fn parse_requirement(lexer: &mut Lexer) -> Result<LabelRequirement, SelectorError> {
    let negated = if lexer.peek() == Token::Not {
        lexer.next();
        true
    } else {
        false
    };
    let key = match lexer.next() {
        Token::Ident(k) => k,
        // `in`/`notin` are valid keys when used as one.
        Token::In => "in".into(),
        Token::NotIn => "notin".into(),
        other => {
            return Err(SelectorError(format!(
                "unable to parse requirement: found '{}', expected: identifier",
                other.text()
            )));
        }
    };
    validate_label_key(&key)?;
    if negated {
        return Ok(LabelRequirement {
            key,
            op: LabelOp::DoesNotExist,
        });
    }
    let op = match lexer.peek() {
        Token::End | Token::Comma => {
            return Ok(LabelRequirement {
                key,
                op: LabelOp::Exists,
            });
        }
        _ => lexer.next(),
    };
    let op = match op {
        Token::Eq | Token::DoubleEq => LabelOp::Equals(single_value(lexer)?),
        Token::NotEq => LabelOp::NotEquals(single_value(lexer)?),
        Token::In => LabelOp::In(value_set(lexer)?),
        Token::NotIn => LabelOp::NotIn(value_set(lexer)?),
        Token::Gt | Token::Lt => {
            let v = single_value(lexer)?;
            let n = v.parse::<i64>().map_err(|_| {
                SelectorError(
                    "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer"
                        .to_string(),
                )
            })?;
            if op == Token::Gt {
                LabelOp::GreaterThan(n)
            } else {
                LabelOp::LessThan(n)
            }
        }
        other => {
            return Err(SelectorError(format!(
                "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                other.text()
            )));
        }
    };
    Ok(LabelRequirement { key, op })
}

fn single_value(lexer: &mut Lexer) -> Result<String, SelectorError> {
    match lexer.peek() {
        Token::Ident(v) => {
            lexer.next();
            validate_label_value(&v)?;
            Ok(v)
        }
        Token::In | Token::NotIn => Ok(lexer.next().text()),
        Token::End | Token::Comma => Ok(String::new()),
        other => Err(SelectorError(format!(
            "found '{}', expected: identifier",
            other.text()
        ))),
    }
}

fn value_set(lexer: &mut Lexer) -> Result<Vec<String>, SelectorError> {
    if lexer.next() != Token::Open {
        return Err(SelectorError("found '', expected: '('".into()));
    }
    let mut values = Vec::new();
    loop {
        match lexer.next() {
            Token::Ident(v) => {
                validate_label_value(&v)?;
                values.push(v);
            }
            Token::Comma => continue,
            Token::Close => break,
            other => {
                return Err(SelectorError(format!(
                    "found '{}', expected: ',', ')' or identifier",
                    other.text()
                )));
            }
        }
    }
    if values.is_empty() {
        return Err(SelectorError(
            "for 'in', 'notin' operators, values set can't be empty".into(),
        ));
    }
    Ok(values)
}

fn validate_label_key(key: &str) -> Result<(), SelectorError> {
    let errs = super::validation::qualified_name_errors(key);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: key: Invalid value: {key:?}: {}",
            errs.join("; ")
        )))
    }
}

fn validate_label_value(value: &str) -> Result<(), SelectorError> {
    let errs = super::validation::label_value_errors(value);
    if errs.is_empty() {
        Ok(())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: values[0][]: Invalid value: {value:?}: {}",
            errs.join("; ")
        )))
    }
}

#[derive(Debug, Clone, PartialEq)]
struct FieldRequirement {
    field: String,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector`, checked against the fields the kind supports.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    pub fn parse(text: &str, info: &ResourceInfo) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for part in split_unescaped(text, ',') {
            if part.is_empty() {
                continue;
            }
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{text}'; can't understand '{part}'"
                )));
            };
            let field = field.trim().to_string();
            if !supported_fields(info.fields).contains(&field.as_str()) {
                return Err(if info.is_custom() {
                    SelectorError(format!(
                        "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                    ))
                } else {
                    SelectorError(format!("field label not supported: {field}"))
                });
            }
            requirements.push(FieldRequirement {
                field,
                value: unescape(value),
                equal,
            });
        }
        Ok(Self { requirements })
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements.iter().all(|r| {
            let actual = field_value(obj, &r.field);
            (actual == r.value) == r.equal
        })
    }

    /// `metadata.name=<x>` when the selector pins one name (watch fast path).
    pub fn pinned_name(&self) -> Option<&str> {
        self.requirements
            .iter()
            .find(|r| r.equal && r.field == "metadata.name")
            .map(|r| r.value.as_str())
    }
}

fn supported_fields(set: FieldSet) -> &'static [&'static str] {
    match set {
        FieldSet::Meta => &["metadata.name", "metadata.namespace"],
        FieldSet::Pod => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        FieldSet::Event => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        FieldSet::Namespace => &["metadata.name", "status.phase"],
        FieldSet::Secret => &["metadata.name", "metadata.namespace", "type"],
        FieldSet::Node => &["metadata.name", "spec.unschedulable"],
    }
}

/// The string a field selector compares, as the apiserver's
/// `ToSelectableFields` produces it (absent fields compare as "").
fn field_value(obj: &Value, field: &str) -> String {
    match field {
        "spec.hostNetwork" => meta::path(obj, field)
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .to_string(),
        "spec.unschedulable" => meta::path(obj, field)
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .to_string(),
        "status.podIPs" => meta::path(obj, "status.podIPs")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(|ip| ip.get("ip"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        "source" => meta::path_str(obj, "source.component")
            .unwrap_or("")
            .to_string(),
        _ => match meta::path(obj, field) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            Some(Value::Bool(b)) => b.to_string(),
            _ => String::new(),
        },
    }
}

fn split_unescaped(text: &str, sep: char) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts
}

fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut escaped = false;
    for c in text.chars() {
        if escaped {
            out.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds;
    use rstest::rstest;
    use serde_json::json;

    fn pod(labels: Value, phase: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}, "status": {"phase": phase}})
    }

    #[rstest]
    #[case("app=a", true)]
    #[case("app==a", true)]
    #[case("app!=a", false)]
    #[case("app", true)]
    #[case("!app", false)]
    #[case("!missing", true)]
    #[case("app in (a,b)", true)]
    #[case("app notin (a,b)", false)]
    #[case("missing notin (a)", true)]
    #[case("app=a,tier=web", true)]
    #[case("app=a,tier=db", false)]
    #[case("app.kubernetes.io/managed-by=telo", true)]
    #[case("", true)]
    fn label_selectors_match_like_the_apiserver(#[case] sel: &str, #[case] expected: bool) {
        let obj = pod(
            json!({"app": "a", "tier": "web", "app.kubernetes.io/managed-by": "telo"}),
            "Running",
        );
        let s = LabelSelector::parse(sel).expect("parses");
        assert_eq!(s.matches(&obj), expected, "{sel}");
    }

    #[rstest]
    #[case("app in a")]
    #[case("app=(x)")]
    #[case("=x")]
    #[case("app=a b")]
    #[case("app=a,")]
    fn malformed_label_selectors_are_rejected(#[case] sel: &str) {
        assert!(LabelSelector::parse(sel).is_err(), "{sel}");
    }

    #[test]
    fn pod_field_selectors_cover_phase_and_name() {
        let info = kinds::pods().info();
        let obj = pod(json!({}), "Running");
        let s = FieldSelector::parse("metadata.name=p,status.phase!=Failed", info).expect("parses");
        assert!(s.matches(&obj));
        assert_eq!(s.pinned_name(), Some("p"));
        let s = FieldSelector::parse("status.phase=Pending", info).expect("parses");
        assert!(!s.matches(&obj));
    }

    #[test]
    fn unsupported_field_labels_are_rejected_with_the_apiserver_message() {
        let err = FieldSelector::parse("spec.foo=x", kinds::id("configmaps").info()).unwrap_err();
        assert_eq!(err.0, "field label not supported: spec.foo");
        let err = FieldSelector::parse("spec.foo=x", kinds::id("httproutes").info()).unwrap_err();
        assert_eq!(
            err.0,
            "\"spec.foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        );
    }
}
