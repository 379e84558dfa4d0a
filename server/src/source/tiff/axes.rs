//! What the pages of a file are: the axes they stack along, read from an OME-XML or ImageJ
//! image description (labels, sizes, physical scale), or one axis of pages.

use crate::source::meta::canonical;

/// How the pages stack, slowest axis first, and what the description says about scale.
#[derive(Clone, Debug, PartialEq)]
pub struct Stacking {
    /// `"ome-tiff"`, `"imagej"` or `"tiff"`.
    pub flavour: &'static str,
    /// The page axes, slowest first, each with its label and size (size-1 axes dropped).
    pub axes: Vec<(String, u64)>,
    /// The size of a step along each page axis and its unit (µm for lengths), when known.
    pub axis_scale: Vec<(f64, String)>,
    /// The size of a pixel along y and x and its unit, when the description gives them.
    pub pixel_scale: Option<[(f64, String); 2]>,
}

/// Why the description cannot be served.
#[derive(Debug, PartialEq)]
pub enum StackError {
    /// The pages do not match what the description declares.
    Pages(String),
    /// An OME-XML set whose planes lie in another file.
    MultiFile(String),
}

/// The stacking of `pages` pages of `width` x `height` pixels with `samples` samples each,
/// as the first page's description says (the file is named `file_name`).
pub fn stacking(
    description: Option<&str>,
    pages: u64,
    width: u64,
    height: u64,
    samples: u64,
    file_name: &str,
) -> Result<Stacking, StackError> {
    let text = description.unwrap_or("").trim_start();
    if (text.starts_with("<?xml") || text.starts_with("<OME"))
        && let Ok(doc) = roxmltree::Document::parse(text)
    {
        return ome(&doc, pages, width, height, samples, file_name);
    }
    if text.starts_with("ImageJ=") {
        return imagej(text, pages);
    }
    Ok(Stacking {
        flavour: "tiff",
        axes: if pages > 1 {
            vec![("z".to_string(), pages)]
        } else {
            Vec::new()
        },
        axis_scale: Vec::new(),
        pixel_scale: None,
    })
}

fn ome(
    doc: &roxmltree::Document,
    pages: u64,
    width: u64,
    height: u64,
    samples: u64,
    file_name: &str,
) -> Result<Stacking, StackError> {
    let images: Vec<_> = doc
        .descendants()
        .filter(|n| n.tag_name().name() == "Image")
        .collect();
    if images.len() > 1 {
        return Err(StackError::Pages(format!(
            "its OME-XML lists {} images (series); only single-image OME-TIFF files are read",
            images.len()
        )));
    }
    for uuid in doc.descendants().filter(|n| n.tag_name().name() == "UUID") {
        if let Some(name) = uuid.attribute("FileName")
            && name != file_name
        {
            return Err(StackError::MultiFile(name.to_string()));
        }
    }
    let pixels = doc
        .descendants()
        .find(|n| n.tag_name().name() == "Pixels")
        .ok_or_else(|| StackError::Pages("its OME-XML has no Pixels element".into()))?;
    let size = |name: &str| -> u64 {
        pixels
            .attribute(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    };
    if size("SizeX") != width || size("SizeY") != height {
        return Err(StackError::Pages(format!(
            "its OME-XML says {} x {} pixels where the pages are {width} x {height}",
            size("SizeX"),
            size("SizeY")
        )));
    }
    let mut size_c = size("SizeC");
    if samples > 1 && size_c % samples == 0 {
        size_c /= samples;
    }
    let order = pixels.attribute("DimensionOrder").unwrap_or("XYZCT");
    let mut axes = Vec::new();
    let mut axis_scale = Vec::new();
    for letter in order.chars().rev().filter(|c| matches!(c, 'Z' | 'C' | 'T')) {
        let (n, scale) = match letter {
            'Z' => (size("SizeZ"), physical(&pixels, "PhysicalSizeZ")),
            'C' => (size_c, (1.0, String::new())),
            _ => (size("SizeT"), time_step(&pixels)),
        };
        if n > 1 {
            axes.push((letter.to_ascii_lowercase().to_string(), n));
            axis_scale.push(scale);
        }
    }
    let planes: u64 = axes.iter().map(|(_, n)| n).product();
    if planes != pages {
        return Err(StackError::Pages(format!(
            "its OME-XML declares {planes} planes ({order}) where the file has {pages} pages"
        )));
    }
    let pixel_scale = (pixels.attribute("PhysicalSizeX").is_some()
        || pixels.attribute("PhysicalSizeY").is_some())
    .then(|| {
        [
            physical(&pixels, "PhysicalSizeY"),
            physical(&pixels, "PhysicalSizeX"),
        ]
    });
    Ok(Stacking {
        flavour: "ome-tiff",
        axes,
        axis_scale,
        pixel_scale,
    })
}

/// A `PhysicalSize*` attribute with its unit (micrometres by default), canonical.
fn physical(pixels: &roxmltree::Node, name: &str) -> (f64, String) {
    let size = pixels
        .attribute(name)
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(1.0);
    let unit = pixels
        .attribute(format!("{name}Unit").as_str())
        .unwrap_or("µm");
    canonical(size, unit)
}

/// `TimeIncrement` with its unit (seconds by default), when given.
fn time_step(pixels: &roxmltree::Node) -> (f64, String) {
    match pixels
        .attribute("TimeIncrement")
        .and_then(|v| v.parse::<f64>().ok())
    {
        Some(step) => (
            step,
            pixels
                .attribute("TimeIncrementUnit")
                .unwrap_or("s")
                .to_string(),
        ),
        None => (1.0, String::new()),
    }
}

/// An ImageJ description: `key=value` lines; `images` pages stacked as frames, slices,
/// channels (channels fastest), `spacing` and `unit` the z step.
fn imagej(text: &str, pages: u64) -> Result<Stacking, StackError> {
    let value = |key: &str| -> Option<&str> {
        text.lines()
            .filter_map(|l| l.split_once('='))
            .find(|(k, _)| k.trim() == key)
            .map(|(_, v)| v.trim())
    };
    let count = |key: &str| value(key).and_then(|v| v.parse::<u64>().ok()).unwrap_or(1);
    let images = value("images")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(pages);
    let (frames, slices, channels) = (count("frames"), count("slices"), count("channels"));
    if images != pages {
        return Err(StackError::Pages(format!(
            "its ImageJ description declares {images} images where the file has {pages} pages (an ImageJ file written without a directory per image is not read)"
        )));
    }
    let declared = frames.saturating_mul(slices).saturating_mul(channels);
    let (frames, slices, channels) = if declared == images {
        (frames, slices, channels)
    } else if declared == 1 {
        (1, images, 1)
    } else {
        return Err(StackError::Pages(format!(
            "its ImageJ description declares {frames} frames x {slices} slices x {channels} channels, not its {images} images"
        )));
    };
    let unit = value("unit").unwrap_or("").replace("\\u00B5", "µ");
    let spacing = value("spacing").and_then(|v| v.parse::<f64>().ok());
    let mut axes = Vec::new();
    let mut axis_scale = Vec::new();
    for (label, n) in [("t", frames), ("z", slices), ("c", channels)] {
        if n > 1 {
            axes.push((label.to_string(), n));
            axis_scale.push(match (label, spacing) {
                ("z", Some(step)) => canonical(step, &unit),
                _ => (1.0, String::new()),
            });
        }
    }
    Ok(Stacking {
        flavour: "imagej",
        axes,
        axis_scale,
        pixel_scale: None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn imagej_hyperstacks_stack_frames_slices_channels() {
        let d = "ImageJ=1.11a\nimages=24\nchannels=2\nslices=3\nframes=4\nhyperstack=true\n";
        let s = stacking(Some(d), 24, 8, 8, 1, "a.tif").unwrap();
        let labels: Vec<_> = s.axes.iter().map(|(l, n)| (l.as_str(), *n)).collect();
        assert_eq!(labels, [("t", 4), ("z", 3), ("c", 2)]);
        assert!(stacking(Some("ImageJ=1\nimages=30\n"), 24, 8, 8, 1, "a.tif").is_err());
    }

    #[test]
    fn ome_xml_gives_order_sizes_scale_and_refuses_other_files() {
        let xml = r#"<?xml version="1.0"?><OME xmlns="http://www.openmicroscopy.org/Schemas/OME/2016-06"><Image ID="Image:0"><Pixels DimensionOrder="XYZCT" SizeX="8" SizeY="6" SizeZ="3" SizeC="2" SizeT="1" PhysicalSizeX="0.5" PhysicalSizeY="0.5" PhysicalSizeZ="2" PhysicalSizeZUnit="nm" Type="uint16"/></Image></OME>"#;
        let s = stacking(Some(xml), 6, 8, 6, 1, "a.ome.tif").unwrap();
        assert_eq!(s.flavour, "ome-tiff");
        assert_eq!(s.axes, [("c".to_string(), 2), ("z".to_string(), 3)]);
        assert_eq!(s.axis_scale[1], (0.002, "µm".to_string()));
        assert_eq!(s.pixel_scale.unwrap()[1], (0.5, "µm".to_string()));
        assert!(matches!(
            stacking(Some(xml), 5, 8, 6, 1, "a.ome.tif"),
            Err(StackError::Pages(_))
        ));
        let multi = xml.replace(
            "Type=\"uint16\"/>",
            "Type=\"uint16\"><TiffData><UUID FileName=\"b.ome.tif\">urn:uuid:1</UUID></TiffData></Pixels>",
        );
        assert_eq!(
            stacking(Some(&multi), 6, 8, 6, 1, "a.ome.tif"),
            Err(StackError::MultiFile("b.ome.tif".into()))
        );
    }
}
