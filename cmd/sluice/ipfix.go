package main

import (
	"bufio"
	"fmt"
	"io"
	"sort"

	"github.com/spf13/cobra"

	"sluice/capture"
	"sluice/ipfix"
	"sluice/ipfix/ipfixjson"
)

func newIPFIXCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ipfix",
		Short: "Work with IPFIX messages",
	}
	cmd.AddCommand(newIPFIXDecodeCmd())
	return cmd
}

func newIPFIXDecodeCmd() *cobra.Command {
	var port uint16
	cmd := &cobra.Command{
		Use:   "decode [--port N] FILE...",
		Short: "Print the data records of IPFIX files as JSON, one object per line",
		Long: `Reads IPFIX messages from each FILE: a raw IPFIX stream (what a TCP collector
receives) or a pcap/pcapng capture, of which the UDP datagrams and TCP streams
to or from --port are read. The format is detected from the file's magic
number. Templates are kept per transport session, as a collector keeps them.

Each data record becomes one JSON object on stdout: element names as keys,
typed values, unknown elements as "<enterprise>:<id>": "<hex>", and the
message context in "@template", "@observationDomainId" and "@exportTime".
Errors go to stderr with their offset; the exit status is 1 if any message
failed to decode.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !decodeFiles(cmd.OutOrStdout(), cmd.ErrOrStderr(), args, port) {
				return exitError{1}
			}
			return nil
		},
	}
	cmd.Flags().Uint16Var(&port, "port", 4739, "port of the IPFIX traffic in a capture")
	return cmd
}

// decodeFiles prints every record of every file and reports whether all
// of them decoded cleanly.
func decodeFiles(stdout, stderr io.Writer, paths []string, port uint16) bool {
	out := bufio.NewWriterSize(stdout, 1<<16)
	defer out.Flush()
	ok := true
	for _, path := range paths {
		if !decodeFile(out, stderr, path, port) {
			ok = false
		}
	}
	return ok
}

type decodeSession struct {
	sess *ipfix.Session
	dec  *ipfix.Decoder
}

func decodeFile(out *bufio.Writer, stderr io.Writer, path string, port uint16) bool {
	ok := true
	sessions := map[string]*decodeSession{}
	var line []byte
	problems, err := capture.ReadFile(path, port, func(m capture.Message) error {
		s := sessions[m.Session]
		if s == nil {
			opts := ipfix.SessionOptions{}
			if m.UDP {
				opts.TemplateTTL = ipfix.DefaultUDPTemplateTTL
			}
			s = &decodeSession{sess: ipfix.NewSession(opts)}
			s.dec = ipfix.NewDecoder(s.sess)
			sessions[m.Session] = s
		}
		// Template lifetimes follow the export clock of the capture, not
		// the wall clock of whoever reads it later.
		h, _ := ipfix.ParseHeader(m.Data)
		if err := s.dec.Reset(m.Data, h.Time()); err == nil {
			for s.dec.Next() {
				line = ipfixjson.AppendRecord(line[:0], s.dec.Header(), s.dec.Record())
				line = append(line, '\n')
				if _, err := out.Write(line); err != nil {
					return err
				}
			}
		}
		if err := s.dec.Err(); err != nil {
			ok = false
			fmt.Fprintf(stderr, "%s: %s, %s: %v\n", path, m.Where, m.Session, err)
		}
		return nil
	})
	for _, p := range problems {
		ok = false
		fmt.Fprintf(stderr, "%s: %s: %s\n", path, p.Session, p.Msg)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", path, err)
		return false
	}
	names := make([]string, 0, len(sessions))
	for name := range sessions {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if st := sessions[name].sess.Stats; st.UnknownTemplateSets > 0 {
			fmt.Fprintf(stderr, "%s: %s: skipped %d data sets (%d octets) whose template was not (or no longer) announced\n",
				path, name, st.UnknownTemplateSets, st.UnknownTemplateBytes)
		}
	}
	return ok
}
