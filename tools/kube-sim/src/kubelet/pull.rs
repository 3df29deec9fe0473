//! Image pulls: the simulated pull with its delay and events, pull failures
//! and their back-off, and the image id a pulled container reports.

use super::*;

impl Kubelet {
    /// A container stuck before it could start because of its image: its
    /// waiting state, then the two Warning events a real kubelet emits (the
    /// specific one and `Failed: Error: <reason>`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report_pull_failure(
        &self,
        w: &PodWorker,
        init: bool,
        idx: usize,
        fp: &str,
        reason: &str,
        message: &str,
        event_reason: &str,
        event_message: &str,
    ) {
        self.container_model(w, init, idx, |m| {
            m.state = ContainerState::Waiting {
                reason: reason.into(),
                message: Some(message.to_owned()),
            };
        });
        self.publish(w);
        self.event(
            w,
            Some(fp.to_owned()),
            EventType::Warning,
            event_reason,
            event_message,
        );
        self.event(
            w,
            Some(fp.to_owned()),
            EventType::Warning,
            "Failed",
            &format!("Error: {reason}"),
        );
    }

    pub(super) fn pull_failures(&self, w: &PodWorker, container: &str) -> u32 {
        let mut counts = w.pull_failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(container.to_string()).or_insert(0);
        *n += 1;
        *n - 1
    }

    pub(super) async fn pull(
        &self,
        w: &PodWorker,
        c: &Container,
        init: bool,
        idx: usize,
    ) -> Result<ImageBehaviour, PullFailure> {
        let image = cimage(c).to_string();
        let name = cname(c).to_string();
        let fp = field_path(init, &name);
        if let Some(msg) = images::invalid_reference(&image) {
            return Err(PullFailure::Invalid(msg));
        }
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let behaviour = self.images.pullable(&image).cloned();
        let present = self
            .pulled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&image);
        match (&behaviour, policy) {
            (Some(ImageBehaviour::PullError(_)) | None, "Never") => {
                return Err(PullFailure::NeverPull(format!(
                    "Container image {image:?} is not present with pull policy of Never"
                )));
            }
            (Some(b), "Never") => return Ok(b.clone()),
            (Some(b), "IfNotPresent") if present && !matches!(b, ImageBehaviour::PullError(_)) => {
                self.event(
                    w,
                    Some(fp),
                    EventType::Normal,
                    "Pulled",
                    &format!("Container image {image:?} already present on machine"),
                );
                self.set_image_id(w, init, idx, &image);
                return Ok(b.clone());
            }
            _ => {}
        }
        self.event(
            w,
            Some(fp.clone()),
            EventType::Normal,
            "Pulling",
            &format!("Pulling image {image:?}"),
        );
        let started = Instant::now();
        tokio::time::sleep(self.pull_delay).await;
        match behaviour {
            None => Err(PullFailure::Failed(images::not_found_message(&image))),
            Some(ImageBehaviour::PullError(msg)) => Err(PullFailure::Failed(if msg.is_empty() {
                images::not_found_message(&image)
            } else {
                msg
            })),
            Some(b) => {
                let took = started.elapsed().as_secs_f64();
                self.pulled
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(image.clone());
                self.event(
                    w,
                    Some(fp),
                    EventType::Normal,
                    "Pulled",
                    &format!("Successfully pulled image {image:?} in {took:.3}s ({took:.3}s including waiting). Image size: 4242424 bytes."),
                );
                self.set_image_id(w, init, idx, &image);
                Ok(b)
            }
        }
    }

    /// The docker runtime's pull: an image is present when the engine has
    /// it (and, once published globs are given, one of them matches it);
    /// nothing is ever pulled, so an absent image fails exactly as an
    /// unknown one does in the process runtime.
    pub(super) async fn pull_engine(
        &self,
        engine: &Engine,
        w: &PodWorker,
        c: &Container,
        init: bool,
        idx: usize,
    ) -> Result<ImageInfo, PullFailure> {
        let image = cimage(c).to_string();
        let fp = field_path(init, cname(c));
        if let Some(msg) = images::invalid_reference(&image) {
            return Err(PullFailure::Invalid(msg));
        }
        let policy = c.image_pull_policy.as_deref().unwrap_or("IfNotPresent");
        let local = if self.images.is_published(&image) {
            engine.image(&image).await
        } else {
            None
        };
        let record_id = |info: &ImageInfo| {
            let id = info.image_id.clone();
            self.container_model(w, init, idx, |m| m.image_id = id);
        };
        match (&local, policy) {
            (None, "Never") => {
                return Err(PullFailure::NeverPull(format!(
                    "Container image {image:?} is not present with pull policy of Never"
                )));
            }
            (Some(info), "Never" | "IfNotPresent") => {
                self.event(
                    w,
                    Some(fp),
                    EventType::Normal,
                    "Pulled",
                    &format!("Container image {image:?} already present on machine"),
                );
                record_id(info);
                return Ok(info.clone());
            }
            _ => {}
        }
        self.event(
            w,
            Some(fp.clone()),
            EventType::Normal,
            "Pulling",
            &format!("Pulling image {image:?}"),
        );
        let started = Instant::now();
        tokio::time::sleep(self.pull_delay).await;
        match local {
            None => Err(PullFailure::Failed(images::not_found_message(&image))),
            Some(info) => {
                let took = started.elapsed().as_secs_f64();
                self.event(
                    w,
                    Some(fp),
                    EventType::Normal,
                    "Pulled",
                    &format!(
                        "Successfully pulled image {image:?} in {took:.3}s ({took:.3}s including waiting). Image size: {} bytes.",
                        info.size
                    ),
                );
                record_id(&info);
                Ok(info)
            }
        }
    }

    pub(super) fn set_image_id(&self, w: &PodWorker, init: bool, idx: usize, image: &str) {
        let id = images::image_id(image);
        self.container_model(w, init, idx, |m| m.image_id = id);
    }
}
