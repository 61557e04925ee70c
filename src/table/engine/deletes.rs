//! Where the rows a commit removes are deleted: position deletes for rows
//! the state locates, equality deletes on the keys for the others, each in
//! the partition spec and partition of the data files it applies to (read
//! from the target's manifests when needed).

use std::collections::HashMap;

use arrow_array::{ArrayRef, RecordBatch};
use iceberg::io::FileIO;
use iceberg::spec::{DataFile, ManifestContentType, Schema, Struct};

use super::Engine;
use crate::core::flow::START_AT;
use crate::core::state::Loc;
use crate::error::{Error, Result, codes};
use crate::table::write::{self, FileNamer};

impl Engine {
    /// Delete files for the rows a resolution removes: position deletes for
    /// rows whose file and position the state knows, equality deletes on
    /// the keys for the others. Each delete file has the partition spec and
    /// partition of the data files it applies to: after `partition_by`
    /// changed, a row in a file of an older spec is deleted in that spec.
    pub(super) async fn delete_files(
        &mut self,
        file_io: &FileIO,
        namer: &mut FileNamer,
        remove_positions: &[Loc],
        remove_rows: &RecordBatch,
    ) -> Result<Vec<(i32, DataFile)>> {
        let meta = self.target.metadata.clone();
        let spec_id = meta.default_partition_spec_id();
        // Files of more than one spec may be live: the files decide.
        let respecced = meta.partition_specs_iter().len() > 1;
        let partitioned = self.partitioner.is_some() || respecced;
        if partitioned
            && (!remove_positions.is_empty()
                || (remove_rows.num_rows() > 0 && (respecced || !self.partitioned_by_keys)))
        {
            self.load_file_partitions().await?;
        }
        let schema = meta.current_schema();
        let eq_names = if remove_rows.num_rows() == 0 {
            Vec::new()
        } else {
            self.equality_columns(schema)?
        };
        let key_names: Vec<&str> = eq_names.iter().map(String::as_str).collect();
        let key_cols: Vec<ArrayRef> = key_names
            .iter()
            .map(|n| {
                remove_rows
                    .column_by_name(n)
                    .cloned()
                    .expect("removed rows are in the target schema")
            })
            .collect();
        let all_rows: Vec<u32> = (0..remove_rows.num_rows() as u32).collect();
        // Every file is made first, then all are written, several at once.
        let mut out = Vec::new();
        if !partitioned {
            let pos: Vec<(&str, u32)> = remove_positions
                .iter()
                .map(|l| (self.state.files().path(l.file), l.pos))
                .collect();
            let none = Struct::empty();
            let pos = write::position_deletes(namer, spec_id, &none, "", pos)?;
            let eq = write::equality_deletes(
                namer, schema, spec_id, &none, "", &key_names, &key_cols, &all_rows,
            )?;
            return write::write_deletes(file_io, pos.into_iter().chain(eq).collect()).await;
        }
        let empty = HashMap::new();
        let parts = self.file_partitions.as_ref().unwrap_or(&empty);
        // Where a delete file of (spec, partition) goes: the partition's
        // directory in the default spec, else beside a data file it applies to.
        let dir = |spec: i32, part: &Struct, beside: &str| match &self.partitioner {
            Some(p) if spec == spec_id => p.path(part),
            _ => write::partition_dir(meta.location(), beside),
        };

        // Position deletes, grouped by the (spec, partition) of the file they point into.
        // (directory, (data file, position) per deleted row)
        type Deleted<'a> = (String, Vec<(&'a str, u32)>);
        let mut by_part: HashMap<(i32, &Struct), Deleted> = HashMap::new();
        for l in remove_positions {
            let path = self.state.files().path(l.file);
            let Some((spec, part)) = parts.get(path) else {
                return Err(Error::State {
                    code: codes::UNKNOWN_FILE,
                    message: format!(
                        "flow `{}`: the state places a row in {path}, which is not a live data file of {}; the table was rewritten by another writer. Run `autocdc refresh --full {}`",
                        self.flow.name, self.flow.target, self.flow.name
                    ),
                });
            };
            by_part
                .entry((*spec, part))
                .or_insert_with(|| (dir(*spec, part, path), Vec::new()))
                .1
                .push((path, l.pos));
        }
        for ((spec, part), (dir, pos)) in by_part {
            out.extend(write::position_deletes(namer, spec, part, &dir, pos)?);
        }

        // Equality deletes: in the default spec, in the key's own partition
        // when keys alone decide it; everywhere else, in every partition
        // that has data files.
        if remove_rows.num_rows() == 0 {
            return write::write_deletes(file_io, out).await;
        }
        let mut groups: Vec<(i32, Struct, String, Vec<u32>)> = Vec::new();
        let with_files: std::collections::HashSet<(i32, &Struct)> =
            parts.values().map(|(spec, part)| (*spec, part)).collect();
        let by_keys = match &self.partitioner {
            Some(p) if self.partitioned_by_keys => {
                for (part, rows) in p.group(remove_rows)? {
                    // With the files loaded, only partitions that have some.
                    if self.file_partitions.is_none() || with_files.contains(&(spec_id, &part)) {
                        let dir = p.path(&part);
                        groups.push((spec_id, part, dir, rows));
                    }
                }
                true
            }
            _ => false,
        };
        let mut seen = std::collections::HashSet::new();
        for (path, (spec, part)) in parts {
            if !(by_keys && *spec == spec_id) && seen.insert((*spec, part)) {
                groups.push((
                    *spec,
                    part.clone(),
                    dir(*spec, part, path),
                    all_rows.clone(),
                ));
            }
        }
        for (spec, part, dir, rows) in groups {
            out.extend(write::equality_deletes(
                namer, schema, spec, &part, &dir, &key_names, &key_cols, &rows,
            )?);
        }
        write::write_deletes(file_io, out).await
    }

    /// The columns an equality delete matches on: the keys, and for SCD Type 2
    /// `__START_AT` (one version of a key).
    fn equality_columns(&self, schema: &Schema) -> Result<Vec<String>> {
        let mut names: Vec<String> = self
            .flow
            .key_idx
            .iter()
            .map(|&i| self.flow.column_name(i).to_string())
            .collect();
        if self.flow.scd2 {
            match schema.field_by_name(START_AT) {
                Some(f) if f.field_type.is_primitive() => names.push(START_AT.to_string()),
                _ => {
                    return Err(Error::State {
                        code: codes::UNSUPPORTED,
                        message: format!(
                            "flow `{}`: a version whose data file another writer rewrote must be removed by equality delete on the keys and {START_AT}, which needs a single sequence_by column; run `autocdc refresh --full {}`",
                            self.flow.name, self.flow.name
                        ),
                    });
                }
            }
        }
        Ok(names)
    }

    /// Reads (spec id, partition) of every live data file from the target's manifests.
    pub(super) async fn load_file_partitions(&mut self) -> Result<()> {
        if self.file_partitions.is_some() {
            return Ok(());
        }
        let mut map = HashMap::new();
        if let Some(snap) = self.target.metadata.current_snapshot() {
            let file_io = self.catalog.file_io();
            let t = self.target.table(file_io)?;
            let list = t.manifest_list_reader(snap).load().await?;
            for m in list.entries() {
                if m.content != ManifestContentType::Data {
                    continue;
                }
                let manifest = m.load_manifest(file_io).await?;
                for e in manifest.entries() {
                    if e.is_alive() {
                        let f = e.data_file();
                        map.insert(
                            f.file_path().to_string(),
                            (m.partition_spec_id, f.partition().clone()),
                        );
                    }
                }
            }
        }
        self.file_partitions = Some(map);
        Ok(())
    }
}
