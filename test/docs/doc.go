// Package docs holds the tests that keep the documentation true to the
// code: the metric names it gives are the metrics Sluice defines.
package docs
