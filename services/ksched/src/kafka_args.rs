//! How every subcommand that talks to Kafka takes client properties, the way Kafka's own
//! tools do: `--command-config FILE` (a properties file) and `-X key=value`, applied over the
//! settings file's `kafka.properties` in that order (docs/security.md).

use std::path::PathBuf;

use clap::Args;
use ksched_core::properties::parse_property;
use ksched_runtime::settings::read_properties_file;

#[derive(Debug, Clone, Default, Args)]
pub(crate) struct KafkaArgs {
    /// A librdkafka property for every Kafka client, e.g. `-X security.protocol=SASL_SSL`
    /// (repeatable; over `--command-config` and the settings file).
    #[arg(short = 'X', long = "property", value_name = "KEY=VALUE", value_parser = parse_property, global = true)]
    pub property: Vec<(String, String)>,
    /// A Kafka client properties file (`key=value` lines), as Kafka's tools take it.
    #[arg(
        long,
        value_name = "FILE",
        global = true,
        env = "KSCHED_COMMAND_CONFIG"
    )]
    pub command_config: Option<PathBuf>,
}

impl KafkaArgs {
    /// The properties to apply, the file's first.
    pub(crate) fn properties(&self) -> ksched_runtime::Result<Vec<(String, String)>> {
        let mut out = match &self.command_config {
            Some(path) => read_properties_file(path)?,
            None => Vec::new(),
        };
        out.extend(self.property.iter().cloned());
        Ok(out)
    }
}
