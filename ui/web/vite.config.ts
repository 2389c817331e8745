import { defineConfig } from 'vite'

// The bundle is committed (ui/dist, embedded by the Go package ui) and
// `make test` rebuilds it and compares: the output must depend on the
// sources only. Fixed file names and no source maps keep it so.
export default defineConfig({
  base: './',
  build: {
    outDir: '../dist',
    emptyOutDir: true,
    sourcemap: false,
    modulePreload: { polyfill: false },
    chunkSizeWarningLimit: 1500,
    rolldownOptions: {
      output: {
        entryFileNames: 'assets/app.js',
        chunkFileNames: 'assets/[name].js',
        assetFileNames: 'assets/[name][extname]',
      },
    },
  },
})
