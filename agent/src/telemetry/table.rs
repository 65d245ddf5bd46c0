//! The [`metrics!`] macro: the table of `Metrics` in telemetry/mod.rs is
//! written once, and its struct fields, collectors and construction are
//! made from it, so a metric cannot be declared without being registered.
//!
//! `table { … }` has one entry per metric, its doc comment first:
//!
//! ```text
//! field: Kind(NAME, "help")                            // IntGauge, IntCounter
//! field: Kind(NAME, "help", ["label", …])              // the …Vec kinds
//! field: Kind(NAME, "help", buckets = BUCKETS)         // Histogram
//! ```
//!
//! After it, `by_hand { field: Type, … }` lists the fields built by
//! hand in `Metrics::new` (they are the parameters of the generated
//! `Metrics::from_table`) and registered by hand in `Metrics::collectors`.

/// Makes `pub struct Metrics`, `Metrics::table_collectors` (the table's
/// collectors, in table order), `Metrics::from_table` (the table's metrics
/// made, the hand-built fields given) and, for tests, `Metrics::TABLE` (the
/// table's names) and `Metrics::touch_table` (one series in each `…Vec`,
/// so that every table metric is gathered).
macro_rules! metrics {
    (
        table {
            $(
                $(#[$doc:meta])*
                $field:ident: $kind:ident(
                    $name:ident, $help:literal
                    $(, [$($label:literal),+ $(,)?])?
                    $(, buckets = $buckets:expr)?
                    $(,)?
                ),
            )+
        }
        by_hand {
            $( $(#[$hand_doc:meta])* $hand:ident: $hand_ty:ty ),+ $(,)?
        }
    ) => {
        /// Every metric the agent exports. Cheap to clone (handles are shared).
        #[derive(Clone)]
        pub struct Metrics {
            $( $(#[$doc])* pub $field: $kind, )+
            $( $(#[$hand_doc])* pub $hand: $hand_ty, )+
        }

        impl Metrics {
            /// The names of the table's metrics, in table order.
            #[cfg(test)]
            const TABLE: &[&str] = &[$($name),+];

            fn table_collectors(&self) -> Vec<Box<dyn ::prometheus::core::Collector>> {
                vec![$(Box::new(self.$field.clone())),+]
            }

            fn from_table($($hand: $hand_ty),+) -> ::prometheus::Result<Self> {
                Ok(Self {
                    $(
                        $field: $crate::telemetry::table::metrics!(@make $kind, $name, $help
                            $(, [$($label),+])? $(, buckets = $buckets)?)?,
                    )+
                    $($hand,)+
                })
            }

            /// One series (each label its own name) in every `…Vec` of the table.
            #[cfg(test)]
            fn touch_table(&self) {
                $( $crate::telemetry::table::metrics!(@touch self.$field $(, [$($label),+])?); )+
            }
        }
    };
    (@make $kind:ident, $name:expr, $help:expr) => {
        $kind::new($name, $help)
    };
    (@make $kind:ident, $name:expr, $help:expr, [$($label:expr),+]) => {
        $kind::new(::prometheus::Opts::new($name, $help), &[$($label),+])
    };
    (@make $kind:ident, $name:expr, $help:expr, buckets = $buckets:expr) => {
        $kind::with_opts(::prometheus::HistogramOpts::new($name, $help).buckets($buckets.to_vec()))
    };
    (@touch $metric:expr) => {};
    (@touch $metric:expr, [$($label:expr),+]) => {
        $metric.with_label_values(&[$($label),+]);
    };
}

pub(super) use metrics;
