package clickhouse

import (
	"context"
	"fmt"
	"strings"
)

// setup connects, learns the server's version, creates the schema when
// asked and reads which columns the table has, so that the INSERT names
// only those (a table made by the reference's schema lacks
// destinationServiceIP).
func (s *Sink) setup(ctx context.Context) error {
	s.attempts.Inc()
	if err := s.conn.Ping(ctx); err != nil {
		return fmt.Errorf("connecting to %s: %w", s.o.Addr, err)
	}
	sv, err := s.conn.ServerVersion()
	if err != nil {
		return fmt.Errorf("server version: %w", err)
	}
	v := Version{Major: sv.Version.Major, Minor: sv.Version.Minor, Patch: sv.Version.Patch}
	if v != s.version {
		s.version = v
		s.o.Log.Info("connected to ClickHouse", "addr", s.o.Addr, "version", v.String(), "database", s.o.Database)
	}
	if s.o.CreateSchema {
		if err := s.createSchema(ctx, v); err != nil {
			return err
		}
	}
	have, err := s.tableColumns(ctx)
	if err != nil {
		return err
	}
	if len(have) == 0 {
		return fmt.Errorf("table %s.%s does not exist: create it (`sluice clickhouse schema` prints the DDL) or set clickHouse.createSchema: true",
			s.o.Database, Table)
	}
	var missing, left []string
	for _, c := range columns {
		switch {
		case have[c.Name]:
		case sluiceOnly[c.Name]:
			left = append(left, c.Name)
		default:
			missing = append(missing, c.Name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("table %s.%s lacks columns %s", s.o.Database, Table, strings.Join(missing, ", "))
	}
	if len(left) > 0 && s.blk == nil {
		s.o.Log.Warn("the flows table lacks Sluice's columns; rows are inserted without them", "columns", strings.Join(left, ", "))
	}
	s.blk = newBlock(s.o.Database, have)
	s.blk.clusterUUID = s.o.ClusterUUID
	s.ready = true
	return nil
}

// tableColumns returns the columns of the flows table (none when it does
// not exist).
func (s *Sink) tableColumns(ctx context.Context) (map[string]bool, error) {
	rows, err := s.conn.Query(ctx, "SELECT name FROM system.columns WHERE database = ? AND table = ?", s.o.Database, Table)
	if err != nil {
		return nil, fmt.Errorf("reading the columns of %s.%s: %w", s.o.Database, Table, err)
	}
	defer rows.Close()
	have := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		have[name] = true
	}
	return have, rows.Err()
}

// createSchema creates the table and the views that do not exist, and
// adds destinationServiceIP to a flows table made without it.
func (s *Sink) createSchema(ctx context.Context, v Version) error {
	stmts, omitted := Schema(SchemaOptions{Database: s.o.Database, TTL: s.o.TTL, Server: v})
	exists := map[string]bool{}
	rows, err := s.conn.Query(ctx, "SELECT name FROM system.tables WHERE database = ?", s.o.Database)
	if err != nil {
		return fmt.Errorf("listing the tables of %s: %w", s.o.Database, err)
	}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		exists[name] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	announced := false
	for _, st := range stmts {
		if exists[st.Object] {
			continue
		}
		if len(omitted) > 0 && !announced {
			announced = true
			s.o.Log.Warn("this ClickHouse cannot take all of the schema; left out", "version", v.String(), "omitted", strings.Join(omitted, "; "))
		}
		if err := s.conn.Exec(ctx, st.SQL); err != nil {
			return fmt.Errorf("creating %s.%s: %w", s.o.Database, st.Object, err)
		}
		s.o.Log.Info("created in ClickHouse", "object", s.o.Database+"."+st.Object)
	}
	if exists[Table] {
		have, err := s.tableColumns(ctx)
		if err != nil {
			return err
		}
		prev := ""
		for _, c := range columns {
			if sluiceOnly[c.Name] && !have[c.Name] {
				q := fmt.Sprintf("ALTER TABLE %s.%s ADD COLUMN %s %s AFTER %s", quote(s.o.Database), Table, c.Name, c.Type, prev)
				if err := s.conn.Exec(ctx, q); err != nil {
					return fmt.Errorf("adding column %s to %s.%s: %w", c.Name, s.o.Database, Table, err)
				}
				s.o.Log.Info("added a column to the flows table", "column", c.Name)
			}
			prev = c.Name
		}
	}
	return nil
}
