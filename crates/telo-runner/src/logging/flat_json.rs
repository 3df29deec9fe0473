//! JSON log lines with the fields of every enclosing span at the top level.
//!
//! `tracing-subscriber`'s own JSON format nests span fields under `span` /
//! `spans`, so a log pipeline filtering on `session_id` would miss every line
//! a session's background work emits without repeating the id. Here span
//! fields are flattened into the line (the innermost span wins a name clash,
//! and an event's own fields win over its spans').

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

pub struct FlatJson;

impl<S, N> FormatEvent<S, N> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let metadata = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), runner_core::time::iso_now().into());
        line.insert("level".into(), metadata.level().as_str().into());
        line.insert("target".into(), metadata.target().into());
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                // With `JsonFields` a span's recorded fields are a JSON object.
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str(&fields.fields)
                {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut FieldVisitor(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

struct FieldVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for FieldVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing::{info, info_span};
    use tracing_subscriber::fmt::MakeWriter;
    use tracing_subscriber::fmt::format::JsonFields;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;

        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    #[test]
    fn a_line_inside_a_session_span_carries_the_session_id_at_the_top_level() {
        let captured = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(captured.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let span = info_span!("session", session_id = %"abc123");
            let _entered = span.enter();
            info!(status = "running", "session status");
        });
        let text = String::from_utf8(captured.0.lock().unwrap_or_else(|p| p.into_inner()).clone())
            .unwrap_or_default();
        let line: Value = serde_json::from_str(text.trim()).unwrap_or_default();
        assert_eq!(line["session_id"], "abc123", "{text}");
        assert_eq!(line["status"], "running");
        assert_eq!(line["message"], "session status");
        assert_eq!(line["level"], "INFO");
    }
}
