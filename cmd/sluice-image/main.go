// Command sluice-image writes Sluice's container image as an OCI layout
// tar (see package deploy/image); `make image` runs it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"

	"sluice/deploy/image"
)

func main() {
	bin := flag.String("binary", "bin/sluice-linux-static", "static sluice binary to put in the image")
	out := flag.String("o", "bin/sluice-image.tar", "output file (OCI image layout, tar)")
	ref := flag.String("ref", "sluice:latest", "image reference; the layout names the image by its normalized form (sluice:v0.1.0 is docker.io/library/sluice:v0.1.0)")
	flag.Parse()
	if err := run(*bin, *out, *ref); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-image:", err)
		os.Exit(1)
	}
}

func run(bin, out, ref string) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return fmt.Errorf("create image file: %w", err)
	}
	w := bufio.NewWriter(f)
	d, err := image.Build(w, image.Options{Binary: bin, Ref: ref})
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out + ".tmp")
		return err
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		return fmt.Errorf("write image file: %w", err)
	}
	name, _ := image.Normalize(ref) // Build has checked it
	fmt.Printf("%s %s %s\n", out, name, d)
	return nil
}
