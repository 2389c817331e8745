package ipfix

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"
)

// DefaultUDPTemplateTTL is how long a template received over UDP lives
// without being refreshed: three times the customary 600 s refresh.
const DefaultUDPTemplateTTL = 3 * 600 * time.Second

// DefaultMaxTemplates bounds the templates one session may hold. A real
// exporter uses a handful; the bound keeps a hostile peer from growing
// memory without limit.
const DefaultMaxTemplates = 4096

// DefaultMaxTemplateFields bounds the field specifiers of all templates of
// one session together (an Antrea template has about 70), so that a few
// huge templates cannot take what many small ones may not.
const DefaultMaxTemplateFields = 65536

// SessionOptions configures a transport session's template state.
type SessionOptions struct {
	// Registry resolves element identities; nil means DefaultRegistry().
	Registry *Registry
	// TemplateTTL expires templates not refreshed for this long; zero
	// means templates live as long as the session (TCP, TLS).
	TemplateTTL time.Duration
	// MaxTemplates bounds the number of templates; zero means
	// DefaultMaxTemplates.
	MaxTemplates int
	// MaxTemplateFields bounds the fields of all templates together; zero
	// means DefaultMaxTemplateFields.
	MaxTemplateFields int
}

// SessionStats counts what a session has seen. Counters only grow.
type SessionStats struct {
	Messages           uint64
	DataRecords        uint64
	TemplatesAdded     uint64 // new template IDs
	TemplatesReplaced  uint64 // an ID re-announced with a new definition
	TemplatesRefreshed uint64 // an ID re-announced unchanged
	TemplatesWithdrawn uint64
	TemplatesExpired   uint64
	// UnknownTemplateSets counts data sets skipped because their template
	// was never announced (or was withdrawn or expired).
	UnknownTemplateSets uint64
	// UnknownTemplateBytes is the payload of those skipped sets.
	UnknownTemplateBytes uint64
	// ReservedSets counts sets with reserved IDs (0, 1, 4-255), skipped.
	ReservedSets uint64
}

type templateKey struct {
	domain uint32
	id     uint16
}

type templateEntry struct {
	t *Template
	// expires is zero when the session has no TTL.
	expires time.Time
}

// Session is the template state of one transport session (a TCP or TLS
// connection, or one UDP source address and port), scoped per observation
// domain as RFC 7011 §8 requires. A Session is not safe for concurrent use:
// one goroutine reads one session.
type Session struct {
	opts      SessionOptions
	templates map[templateKey]templateEntry
	fields    int // field specifiers held, across templates
	Stats     SessionStats
}

// NewSession returns an empty session.
func NewSession(opts SessionOptions) *Session {
	if opts.Registry == nil {
		opts.Registry = DefaultRegistry()
	}
	if opts.MaxTemplates <= 0 {
		opts.MaxTemplates = DefaultMaxTemplates
	}
	if opts.MaxTemplateFields <= 0 {
		opts.MaxTemplateFields = DefaultMaxTemplateFields
	}
	return &Session{opts: opts, templates: map[templateKey]templateEntry{}}
}

// Registry is the registry the session resolves elements with.
func (s *Session) Registry() *Registry { return s.opts.Registry }

// Template returns the live template with the given ID in an observation
// domain, or nil.
func (s *Session) Template(domain uint32, id uint16, now time.Time) *Template {
	e, ok := s.templates[templateKey{domain, id}]
	if !ok {
		return nil
	}
	if !e.expires.IsZero() && now.After(e.expires) {
		s.del(templateKey{domain, id})
		s.Stats.TemplatesExpired++
		return nil
	}
	return e.t
}

// NumTemplates is the number of templates held, expired ones included
// until they are next looked up or swept.
func (s *Session) NumTemplates() int { return len(s.templates) }

// Expire drops every template whose TTL has passed and returns how many.
// Collectors call it periodically so that idle UDP sessions release memory.
func (s *Session) Expire(now time.Time) int {
	n := 0
	for k, e := range s.templates {
		if !e.expires.IsZero() && now.After(e.expires) {
			s.del(k)
			n++
		}
	}
	s.Stats.TemplatesExpired += uint64(n)
	return n
}

func (s *Session) expiry(now time.Time) time.Time {
	if s.opts.TemplateTTL <= 0 {
		return time.Time{}
	}
	return now.Add(s.opts.TemplateTTL)
}

// applyTemplateSet reads every (options) template record of a set and
// updates the session. body is the set's content after its header; off is
// the body's offset in the message, for error messages.
func (s *Session) applyTemplateSet(domain uint32, setID uint16, body []byte, off int, now time.Time) error {
	options := setID == OptionsTemplateSetID
	for len(body) > 0 {
		// Fewer than 4 octets cannot hold a record header: padding.
		if len(body) < 4 {
			return nil
		}
		id := binary.BigEndian.Uint16(body)
		count := binary.BigEndian.Uint16(body[2:])
		if id == 0 && count == 0 {
			return checkPadding(body, off, setID)
		}
		if count == 0 {
			// A withdrawal (RFC 7011 §8.1): the set ID as template ID
			// withdraws every template of that kind in the domain.
			if err := s.withdraw(domain, setID, id, off); err != nil {
				return err
			}
			body, off = body[4:], off+4
			continue
		}
		if id < MinDataSetID {
			return malformed(off, setID, id, "template ID %d is below %d", id, MinDataSetID)
		}
		hdr := 4
		var scope uint16
		if options {
			if len(body) < 6 {
				s.drop(domain, id)
				return malformed(off, setID, id, "options template record header truncated: %d octets left", len(body))
			}
			scope = binary.BigEndian.Uint16(body[4:])
			if scope == 0 || scope > count {
				s.drop(domain, id)
				return malformed(off+4, setID, id, "scope field count %d must be between 1 and the field count %d", scope, count)
			}
			hdr = 6
		}
		n, err := s.applyTemplate(domain, setID, id, scope, count, body[hdr:], off+hdr, now)
		if err != nil {
			// An invalid re-announcement must not leave the old
			// definition in place: data would be read with it.
			s.drop(domain, id)
			return err
		}
		body, off = body[hdr+n:], off+hdr+n
	}
	return nil
}

// applyTemplate parses count field specifiers from b and installs the
// template. It returns how many octets the specifiers took.
func (s *Session) applyTemplate(domain uint32, setID, id, scope, count uint16, b []byte, off int, now time.Time) (int, error) {
	// Walk the specifiers once to find their extent and validate them,
	// without allocating, so an unchanged refresh costs nothing.
	n := 0
	minLen := 0
	for i := 0; i < int(count); i++ {
		if len(b)-n < 4 {
			return 0, malformed(off+n, setID, id, "field specifier %d of %d truncated", i, count)
		}
		rawID := binary.BigEndian.Uint16(b[n:])
		length := binary.BigEndian.Uint16(b[n+2:])
		if length == 0 {
			return 0, malformed(off+n+2, setID, id, "field %d (element %d) has length 0", i, rawID&0x7fff)
		}
		if length == VariableLength {
			minLen++
		} else {
			minLen += int(length)
		}
		n += 4
		if rawID&0x8000 != 0 {
			if len(b)-n < 4 {
				return 0, malformed(off+n, setID, id, "enterprise number of field %d truncated", i)
			}
			n += 4
		}
	}
	if minLen > maxMessageLen-headerLen-setHeaderLen {
		return 0, malformed(off, setID, id, "records of %d octets cannot fit in a message", minLen)
	}
	wire := b[:n]
	key := templateKey{domain, id}
	e, exists := s.templates[key]
	if exists && e.t.ScopeFieldCount == scope && bytes.Equal(e.t.wire, wire) {
		e.expires = s.expiry(now)
		s.templates[key] = e
		s.Stats.TemplatesRefreshed++
		return n, nil
	}
	// A replacement gives back the fields of the definition it replaces.
	old := 0
	if exists {
		old = len(e.t.Fields)
	}
	if s.full(!exists, s.fields-old+int(count)) {
		s.Expire(now)
		// Expire may have removed this very template.
		e, exists = s.templates[key]
		old = 0
		if exists {
			old = len(e.t.Fields)
		}
		if s.full(!exists, s.fields-old+int(count)) {
			return 0, &DecodeError{Offset: off, SetID: setID, TemplateID: id, Kind: ErrTemplateLimit,
				Msg: fmt.Sprintf("session holds %d templates with %d fields; limits are %d and %d",
					len(s.templates), s.fields, s.opts.MaxTemplates, s.opts.MaxTemplateFields)}
		}
	}
	t := &Template{ID: id, ScopeFieldCount: scope, Fields: make([]Field, count), wire: bytes.Clone(wire)}
	p := 0
	for i := range t.Fields {
		f := &t.Fields[i]
		rawID := binary.BigEndian.Uint16(wire[p:])
		f.ID = rawID & 0x7fff
		f.Length = binary.BigEndian.Uint16(wire[p+2:])
		p += 4
		if rawID&0x8000 != 0 {
			f.EnterpriseID = binary.BigEndian.Uint32(wire[p:])
			p += 4
		}
		f.resolve(s.opts.Registry)
	}
	t.layout()
	if _, ok := s.templates[key]; ok {
		s.Stats.TemplatesReplaced++
	} else {
		s.Stats.TemplatesAdded++
	}
	s.del(key)
	s.templates[key] = templateEntry{t: t, expires: s.expiry(now)}
	s.fields += len(t.Fields)
	return n, nil
}

// full reports whether adding a template (isNew) so that the session holds
// fields field specifiers would pass a limit.
func (s *Session) full(isNew bool, fields int) bool {
	return (isNew && len(s.templates) >= s.opts.MaxTemplates) || fields > s.opts.MaxTemplateFields
}

// del removes a template and its share of the field budget.
func (s *Session) del(k templateKey) {
	if e, ok := s.templates[k]; ok {
		s.fields -= len(e.t.Fields)
		delete(s.templates, k)
	}
}

// withdraw handles a withdrawal record for template id.
func (s *Session) withdraw(domain uint32, setID, id uint16, off int) error {
	if id == setID {
		options := setID == OptionsTemplateSetID
		for k, e := range s.templates {
			if k.domain == domain && e.t.IsOptions() == options {
				s.del(k)
				s.Stats.TemplatesWithdrawn++
			}
		}
		return nil
	}
	if id < MinDataSetID {
		return malformed(off, setID, id, "withdrawal of invalid template ID %d", id)
	}
	if _, ok := s.templates[templateKey{domain, id}]; ok {
		s.del(templateKey{domain, id})
		s.Stats.TemplatesWithdrawn++
	}
	return nil
}

func (s *Session) drop(domain uint32, id uint16) {
	s.del(templateKey{domain, id})
}

// checkPadding accepts trailing octets long enough to look like a record
// header only if they are zero, so that a corrupt record is not mistaken
// for padding.
func checkPadding(b []byte, off int, setID uint16) error {
	for i, c := range b {
		if c != 0 {
			return malformed(off+i, setID, 0, "%d trailing octets are neither a record nor zero padding", len(b))
		}
	}
	return nil
}
