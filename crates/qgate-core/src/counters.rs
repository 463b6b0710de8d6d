//! Counters declared once. A daemon's hot paths bump atomics; its admin port shows a snapshot of
//! them; its metrics expose each under a name and a help text. Written by hand, every counter
//! was declared three times (the atomic, the snapshot's field, the collector's call) and the
//! three drifted apart; [`counters!`](crate::counters) makes the one declaration yield all of
//! them (decision W4).

/// Declares a counter struct, its snapshot and the snapshot's metrics.
///
/// ```
/// qgate_core::counters! {
///     /// What the widget has done.
///     pub struct WidgetStats => WidgetSnapshot {
///         /// Widgets made.
///         made: counter "qgate_widget_made", "widgets made";
///         /// Widgets in use now.
///         in_use: gauge "qgate_widget_in_use", "widgets in use now";
///     }
///     extra {
///         /// Not a counter: kept beside them.
///         pub name: String,
///     }
/// }
/// let s = WidgetStats::default();
/// s.made.fetch_add(2, std::sync::atomic::Ordering::Relaxed);
/// assert_eq!(s.snapshot().made, 2);
/// let text = qgate_core::metrics::render(s.snapshot());
/// assert!(text.contains("qgate_widget_made_total 2"), "{text}");
/// ```
///
/// Each field is an `AtomicU64` in the struct and a `u64` in the snapshot (serialized, and
/// read back with missing fields as 0, so a newer daemon's counters do not break an older
/// `ctl`); `counter` or `gauge` says how the metric is typed. The snapshot is a
/// [`Collector`](crate::metrics::Collector), and [`encode`](#method.encode) adds its metrics
/// to a larger collector's.
#[macro_export]
macro_rules! counters {
    (
        $(#[$smeta:meta])*
        $vis:vis struct $name:ident => $snap:ident {
            $(
                $(#[$fmeta:meta])*
                $field:ident: $kind:ident $metric:literal, $help:literal;
            )*
        }
        $(
            extra {
                $(
                    $(#[$emeta:meta])*
                    $evis:vis $efield:ident: $ety:ty,
                )*
            }
        )?
    ) => {
        $(#[$smeta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $(
                $(#[$fmeta])*
                pub $field: ::std::sync::atomic::AtomicU64,
            )*
            $($(
                $(#[$emeta])*
                $evis $efield: $ety,
            )*)?
        }

        #[doc = concat!("A snapshot of [`", stringify!($name), "`]'s counters.")]
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ::serde::Serialize, ::serde::Deserialize)]
        #[serde(default)]
        $vis struct $snap {
            $(
                $(#[$fmeta])*
                pub $field: u64,
            )*
        }

        impl $name {
            /// Read every counter.
            pub fn snapshot(&self) -> $snap {
                $snap {
                    $(
                        $field: self.$field.load(::std::sync::atomic::Ordering::Relaxed),
                    )*
                }
            }
        }

        impl $snap {
            /// Every counter as a metric, under its declared name and help.
            pub fn encode(
                &self,
                e: &mut $crate::metrics::DescriptorEncoder,
            ) -> ::std::fmt::Result {
                $(
                    $crate::metrics::$kind(e, $metric, $help, self.$field)?;
                )*
                Ok(())
            }
        }

        impl $crate::metrics::Collector for $snap {
            fn encode(
                &self,
                mut e: $crate::metrics::DescriptorEncoder,
            ) -> ::std::fmt::Result {
                $snap::encode(self, &mut e)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    crate::counters! {
        /// Two counters and a gauge.
        pub struct Sample => SampleSnapshot {
            /// One.
            one: counter "qgate_test_one", "the first";
            /// Two.
            two: counter "qgate_test_two", "the second";
            /// Now.
            now: gauge "qgate_test_now", "held now";
        }
        extra {
            /// A label.
            pub label: String,
        }
    }

    #[test]
    fn one_declaration_gives_the_atomics_the_snapshot_and_the_metrics() {
        use std::sync::atomic::Ordering::Relaxed;
        let s = Sample::default();
        s.one.fetch_add(3, Relaxed);
        s.now.store(7, Relaxed);
        let snap = s.snapshot();
        assert_eq!((snap.one, snap.two, snap.now), (3, 0, 7));
        let text = crate::metrics::render(snap);
        assert!(text.contains("# HELP qgate_test_one the first"), "{text}");
        assert!(text.contains("qgate_test_one_total 3"), "{text}");
        assert!(text.contains("# TYPE qgate_test_now gauge"), "{text}");
        assert!(text.contains("qgate_test_now 7"), "{text}");
        assert!(s.label.is_empty());
    }
}
