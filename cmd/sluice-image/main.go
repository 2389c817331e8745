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
	ref := flag.String("ref", "sluice:latest", "image reference recorded in the layout")
	flag.Parse()
	if err := run(*bin, *out, *ref); err != nil {
		fmt.Fprintln(os.Stderr, "sluice-image:", err)
		os.Exit(1)
	}
}

func run(bin, out, ref string) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
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
		return err
	}
	fmt.Printf("%s %s %s\n", out, ref, d)
	return nil
}
