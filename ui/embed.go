package ui

import "embed"

// bundle is the built front end (`make ui` rebuilds ui/dist from ui/web;
// `make test` checks that the committed bundle is what a build makes).
//
//go:embed all:dist
var bundle embed.FS
