//! `ksched run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;
use ksched_api::{self as api, Api};
use ksched_runtime::settings::LogSettings;
use ksched_runtime::{Config, Overrides, Scheduler};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Where `ksched run` looks for its settings by default; without it, defaults apply.
pub(crate) const DEFAULT_CONFIG: &str = "config/ksched.yaml";

/// Exit code for configuration errors (the message says what to fix).
pub(crate) const EXIT_CONFIG: u8 = 2;
/// Exit code when the processor stops on an error.
pub(crate) const EXIT_FAILED: u8 = 1;

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Settings file; its directory is where pools_file and policy_dir are looked up.
    #[arg(
        long,
        short = 'c',
        default_value = "config/ksched.yaml",
        env = "KSCHED_CONFIG"
    )]
    pub config: PathBuf,
    /// Kafka bootstrap servers (overrides kafka.bootstrap_servers).
    #[arg(long)]
    pub bootstrap_servers: Option<String>,
    /// RocksDB directory (overrides storage.data_dir).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// HTTP listen address (overrides http.listen).
    #[arg(long)]
    pub http_listen: Option<String>,
    /// Routing file (overrides pools_file).
    #[arg(long)]
    pub pools: Option<PathBuf>,
    /// Policy directory (overrides policy_dir).
    #[arg(long)]
    pub policy_dir: Option<PathBuf>,
    /// Print the effective configuration and exit (secrets masked).
    #[arg(long)]
    pub print_config: bool,
    #[command(flatten)]
    pub kafka: crate::kafka_args::KafkaArgs,
}

impl RunArgs {
    pub(crate) fn load(&self) -> ksched_runtime::Result<Config> {
        let flags = Overrides {
            bootstrap_servers: self.bootstrap_servers.clone(),
            data_dir: self.data_dir.clone(),
            http_listen: self.http_listen.clone(),
            pools_file: self.pools.clone(),
            policy_dir: self.policy_dir.clone(),
            kafka_properties: self.kafka.properties()?,
        };
        let path = self.config.exists().then_some(self.config.as_path());
        if path.is_none() && self.config.as_path() != std::path::Path::new(DEFAULT_CONFIG) {
            return Err(ksched_runtime::Error::Config {
                source_name: self.config.display().to_string(),
                detail: "file not found".into(),
            });
        }
        Config::load(path, std::env::vars(), &flags)
    }
}

/// Keeps trace export alive; flushes it when dropped.
#[derive(Default)]
pub(crate) struct Tracing {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Tracing {
    fn drop(&mut self) {
        #[cfg(feature = "otel")]
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Logs to stderr (text or JSON, filtered by `log.level` or RUST_LOG) and, with the `otel`
/// feature (default) and an endpoint (`log.otlp_endpoint`, else the standard
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`), exports spans over
/// OTLP/HTTP: the job spans of traced jobs (job_trace.rs, through the global tracer provider
/// set here) and the processor's own spans.
pub(crate) fn init_tracing(log: &LogSettings) -> anyhow::Result<Tracing> {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = if log.format == "json" {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_target(false)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().with_target(false).boxed()
    };
    #[allow(unused_mut)]
    let mut guard = Tracing::default();
    #[cfg(feature = "otel")]
    let otel = match (&log.otlp_endpoint, otlp_from_env()) {
        (None, false) => None,
        (endpoint, _) => {
            use opentelemetry::trace::TracerProvider as _;
            use opentelemetry_otlp::WithExportConfig;
            let builder = opentelemetry_otlp::SpanExporter::builder().with_http();
            // Without an endpoint in the config the exporter reads the OTEL_ variables.
            let builder = match endpoint {
                Some(e) => builder.with_endpoint(e),
                None => builder,
            };
            let exporter = builder.build().context("building the OTLP span exporter")?;
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(log.service_name.clone())
                        .build(),
                )
                .build();
            let tracer = provider.tracer("ksched-runtime");
            opentelemetry::global::set_tracer_provider(provider.clone());
            guard.provider = Some(provider);
            Some(tracing_opentelemetry::layer().with_tracer(tracer))
        }
    };
    #[cfg(not(feature = "otel"))]
    if log.otlp_endpoint.is_some() {
        anyhow::bail!(
            "log.otlp_endpoint is set, but this ksched was built without trace export (--no-default-features); build it with the default features"
        );
    }
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    #[cfg(feature = "otel")]
    let registry = registry.with(otel);
    registry.init();
    Ok(guard)
}

/// Whether the standard OTLP environment variables name an endpoint.
#[cfg(feature = "otel")]
fn otlp_from_env() -> bool {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var_os(k).is_some_and(|v| !v.is_empty()))
}

pub(crate) fn main(args: RunArgs) -> ExitCode {
    let config = match args.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ksched run: {e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    if args.print_config {
        print!("{}", config.to_yaml());
        return ExitCode::SUCCESS;
    }
    let _tracing = match init_tracing(&config.settings.log) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ksched run: {e:#}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = format!("{e:#}"), "ksched run failed");
            eprintln!("ksched run: {e:#}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// A running scheduler and its HTTP API, on one async runtime.
pub(crate) struct Service {
    pub rt: tokio::runtime::Runtime,
    pub scheduler: Scheduler,
}

impl Service {
    /// Starts the scheduler (store, topics, ticker, processor) and the HTTP API.
    pub(crate) fn start(config: Config) -> anyhow::Result<Service> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the async runtime")?;
        if !ksched_policy::memory_limits_enforced() {
            warn!(
                "this build does not count its allocations: policy evaluations are bounded in steps (limits.policy_max_steps), not in memory"
            );
        }
        if std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "2")
        {
            warn!(
                "vm.overcommit_memory is 2: a policy that asks for one huge allocation at once is refused by the kernel before its memory limit (limits.policy_max_memory_bytes) can stop it, and the process aborts; keep policies' steps bounded, or use overcommit mode 0 or 1"
            );
        }
        let scheduler = rt.block_on(Scheduler::start(config))?;
        let settings = &scheduler.config.settings;
        if settings.http.enabled {
            let api = Arc::new(Api::new(
                settings,
                scheduler.topics.clone(),
                scheduler.stores.clone(),
                scheduler.shards.clone(),
            )?);
            if !settings.http.authenticates() {
                warn!(
                    listen = %settings.http.listen,
                    "the HTTP API has no authentication (http.tokens_file, http.jwt): anyone who reaches it may approve and cancel jobs; it listens on loopback only"
                );
            }
            let listen = settings.http.listen.clone();
            let tls = match &settings.http.tls {
                Some(t) => Some(ksched_api::tls::server_config(t)?),
                None => None,
            };
            let stop = scheduler.shutdown.clone();
            rt.spawn(async move {
                if let Err(e) = api::serve(&listen, tls, api, stop.cancelled_owned()).await {
                    error!(error = %e, "HTTP API stopped");
                }
            });
        }
        Ok(Service { rt, scheduler })
    }

    /// The token that stops everything.
    pub(crate) fn shutdown(&self) -> CancellationToken {
        self.scheduler.shutdown.clone()
    }

    /// Waits for the processor to stop (on shutdown, or on a fatal error), then stops the
    /// rest. An instance another one replaced keeps answering its API (not ready, and why)
    /// until it is told to stop, so a restart policy does not make two instances fence each
    /// other in turn.
    pub(crate) fn wait(self) -> anyhow::Result<()> {
        let Service { rt, scheduler } = self;
        let shutdown = scheduler.shutdown.clone();
        let shards = scheduler.shards.clone();
        let http = scheduler.config.settings.http.enabled;
        let result = scheduler.wait();
        if let Err(e) = &result
            && matches!(
                e,
                ksched_runtime::Error::Fenced { .. } | ksched_runtime::Error::Replaced { .. }
            )
            && http
            && !shutdown.is_cancelled()
        {
            error!(error = %e, "this instance was replaced; it stays up, not ready, until it is stopped");
            for s in &shards.0 {
                s.set_stopped(e.to_string());
            }
            rt.block_on(shutdown.cancelled());
        }
        shutdown.cancel();
        rt.shutdown_timeout(std::time::Duration::from_secs(2));
        result?;
        info!("ksched stopped");
        Ok(())
    }
}

/// Starts everything and blocks until a signal (or a fatal error) stops it.
pub(crate) fn serve(config: Config) -> anyhow::Result<()> {
    let service = Service::start(config)?;
    service.rt.spawn(signals(service.shutdown()));
    service.wait()
}

/// First SIGINT/SIGTERM: finish the open batch and stop (within `shutdown_grace_ms`).
/// Second: exit at once.
pub(crate) async fn signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        warn!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    info!("shutting down: committing the open batch (signal again to exit at once)");
    shutdown.cancel();
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    eprintln!("ksched: second signal, exiting now");
    std::process::exit(130);
}
